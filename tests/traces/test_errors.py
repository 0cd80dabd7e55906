"""Bad input becomes a TraceError that names the file, the line and the column."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests.traces.builders import HEADERS, csv_text, write_trace
from traces import TraceError, load_trace

# (dialect, column, bad value, fragment of the message). The bad value goes into the third
# data row, i.e. file line 4.
BAD_CELLS: list[tuple[str, str, str, str]] = [
    ("muri", "num_gpu", "abc", "expected a positive integer, got 'abc'"),
    ("muri", "num_gpu", "0", "expected a positive integer, got '0'"),
    ("muri", "num_gpu", "-2", "expected a positive integer, got '-2'"),
    ("muri", "num_gpu", "2.5", "expected a positive integer, got '2.5'"),
    ("muri", "num_gpu", "5000", "less than or equal to 4096"),  # JobSpec's own bound
    ("muri", "iterations", "0", "expected a positive integer"),
    ("muri", "submit_time", "-1", "expected a non-negative number, got '-1'"),
    ("muri", "submit_time", "nan", "expected a non-negative number, got 'nan'"),
    ("muri", "duration", "inf", "expected a non-negative number, got 'inf'"),
    ("muri", "iteration_time", "0", "expected a positive number, got '0'"),
    ("muri", "resource_time_1", "-3", "expected a non-negative number"),
    ("muri", "batch_size", "", "missing value, expected a positive integer"),
    ("muri", "model_name", "", "missing value"),
    ("muri", "model_name", "res net", "should match pattern"),  # JobSpec Name pattern
    ("muri", "job_id", "a b", "should match pattern"),
    ("muri", "interval", "soon", "expected a non-negative number, got 'soon'"),
    ("muri", "priority", "-1", "expected a non-negative integer"),
    ("tiresias", "duration", "0", "expected a positive number, got '0'"),
    ("tiresias", "iterations", "x", "expected a positive integer, got 'x'"),
    ("tiresias", "interval", "-1", "expected a non-negative number"),
    ("elasticflow", "ddl", "-5", "expected a non-negative number, got '-5'"),
    ("elasticflow", "iteration", "0", "expected a positive integer"),
    ("elasticflow", "batch_size", "0", "expected a positive integer"),
    ("elasticflow-best-effort", "best_effort", "2", "expected 0 or 1, got '2'"),
    ("elasticflow-philly", "real_duration", "x", "expected a non-negative number"),
    ("itp", "num_gpu", "0", "expected a positive integer"),
    ("itp", "num_iteration", "1.5", "expected a positive integer, got '1.5'"),
    ("itp", "deadline", "", "missing value"),
    ("itp-raw", "duration", "0", "expected a positive number, got '0'"),
    ("itp-raw", "submission_time", "later", "expected a non-negative number"),
    ("philly", "num_gpus", "0", "expected a positive integer, got '0'"),
    ("philly", "timestamp", "yesterday", "expected a timestamp like"),
    ("philly", "timestamp", "2017-10-09T07:01:55+00:00", "without a time zone"),
    ("philly", "duration", "-66.0", "expected a positive number"),
    ("philly", "gpu_time", "-1", "expected a non-negative number"),
    ("philly", "cluster", "", "missing value"),
    ("philly", "cluster", "vc 1", "should match pattern"),  # tenant must be a Name
]


@pytest.mark.parametrize(
    ("dialect", "column", "value", "fragment"),
    BAD_CELLS,
    ids=[f"{d}-{c}-{v!r}" for d, c, v, _ in BAD_CELLS],
)
def test_bad_cell_names_file_line_and_field(
    tmp_path: Path, dialect: str, column: str, value: str, fragment: str
) -> None:
    path = write_trace(tmp_path, dialect, [{}, {}, {column: value}, {}], name="bad.csv")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.path, err.line, err.field) == (path, 4, column)
    assert str(err).startswith(f"bad.csv line 4, field '{column}': ")
    assert fragment in err.message


def test_message_reads_like_the_documented_example(tmp_path: Path) -> None:
    # Header + 15 good rows, so the bad row is line 17.
    rows: list[dict[str, str]] = [{}] * 15 + [{"num_gpu": "abc"}]
    path = write_trace(tmp_path, "muri", rows, name="trace1.csv")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == (
        "trace1.csv line 17, field 'num_gpu': expected a positive integer, got 'abc'"
    )


def _with_line(dialect: str, bad_line: str) -> str:
    """Two good rows, then `bad_line` as file line 4."""
    text = csv_text(dialect, [{}, {}], newline="\n")
    return text + bad_line + "\n"


@pytest.mark.parametrize(
    ("dialect", "bad_line", "field", "fragment"),
    [
        # Short rows name the first column that is missing.
        ("muri", "7,1,0,100,dqn,128,1000,0,490,446,8,0", "priority", "expected 13 fields, got 12"),
        ("itp-raw", "abc,5,10", "num_gpu", "expected 4 fields, got 3"),
        ("philly", "2017-10-09 07:01:55", "duration", "expected 5 fields, got 1"),
        # A long row has no single culprit column.
        ("tiresias", "7,1,0,100,vgg11,60,20,extra", None, "expected 7 fields, got 8"),
    ],
)
def test_wrong_column_count(
    tmp_path: Path, dialect: str, bad_line: str, field: str | None, fragment: str
) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(_with_line(dialect, bad_line))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (4, field)
    assert fragment in str(info.value)
    assert str(info.value).startswith("rows.csv line 4")


def test_line_numbers_count_blank_lines_and_crlf(tmp_path: Path) -> None:
    text = csv_text("muri", [{}, {}], newline="\r\n") + "\r\n"  # line 4 is blank
    text += csv_text("muri", [{"job_id": "9", "iterations": "zero"}], newline="\r\n").split(
        "\r\n", 1
    )[1]
    path = tmp_path / "crlf.csv"
    path.write_bytes(text.encode())
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (5, "iterations")


@pytest.mark.parametrize("dialect", ["muri", "tiresias", "elasticflow", "itp", "itp-raw"])
def test_duplicate_job_id_names_both_lines(tmp_path: Path, dialect: str) -> None:
    job_id = "3f1e-dup" if dialect.startswith("itp") else "17"
    rows = [{}, {"job_id": job_id}, {}, {"job_id": job_id}]
    path = write_trace(tmp_path, dialect, rows, name="dups.csv")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.line, err.field) == (5, "job_id")
    assert str(err) == (
        f"dups.csv line 5, field 'job_id': duplicate job id {job_id!r} (first on line 3)"
    )


def test_duplicate_ids_are_detected_before_sorting(tmp_path: Path) -> None:
    # The later line arrives earlier; the error must still point at the later line.
    rows = [{"job_id": "a", "submit_time": "9000"}, {"job_id": "a", "submit_time": "0"}]
    with pytest.raises(TraceError) as info:
        load_trace(write_trace(tmp_path, "tiresias", rows))
    assert info.value.line == 3
    assert "first on line 2" in info.value.message


@pytest.mark.parametrize(
    ("content", "line", "field", "fragment"),
    [
        (b"", 1, None, "expected a header row"),
        (b"\n" + ",".join(HEADERS["itp-raw"]).encode() + b"\n", 1, None, "expected a header"),
        (b"job_id,job_id,duration\n", 1, "job_id", "appears twice"),
        (b"job_id,,duration\n", 1, None, "empty column name"),
        (b"job_id,duration\n\xff\xfe,1\n", None, None, "not UTF-8"),
        # An unterminated quote swallows the rest of the file into one field.
        (b'job_id,submission_time,duration,num_gpu\n"a,1,2,3\n', 2, "submission_time", "got 1"),
        (
            b'job_id,submission_time,duration,num_gpu\na,1,2,3\n"' + b"x" * 200_000 + b'",1,2,3\n',
            3,
            None,
            "malformed CSV: field larger than field limit",
        ),
    ],
)
def test_file_level_problems(
    tmp_path: Path, content: bytes, line: int | None, field: str | None, fragment: str
) -> None:
    path = tmp_path / "broken.csv"
    path.write_bytes(content)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (line, field)
    assert fragment in info.value.message


def test_missing_file_path_is_a_trace_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(TraceError) as info:
        load_trace(missing)
    assert info.value.path == missing
    assert info.value.line is None
    assert str(info.value).startswith(str(missing))


def test_unknown_bundled_name_lists_close_matches(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as info:
        load_trace("muri/trace9")
    message = str(info.value)
    assert message.startswith("muri/trace9: no bundled trace or file of that name")
    assert "close matches: muri/trace" in message
    assert "available: " in message and "itp/195job" in message


def test_unnamespaced_trace_name_suggests_the_namespaced_one() -> None:
    with pytest.raises(TraceError, match=r"close matches: muri/trace1, muri/trace1_pr"):
        load_trace("trace1")


def test_trace_error_is_a_value_error_and_survives_pickling() -> None:
    err = TraceError(Path("/x/t.csv"), 3, "num_gpu", "boom")
    assert isinstance(err, ValueError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.path, copy.line, copy.field, copy.message) == (
        Path("/x/t.csv"),
        3,
        "num_gpu",
        "boom",
    )
    assert str(copy) == "t.csv line 3, field 'num_gpu': boom"
    assert str(TraceError("a/b.csv", 2, None, "m")) == "b.csv line 2: m"
