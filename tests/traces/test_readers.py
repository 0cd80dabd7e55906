"""Each reader turns its real file layout into JobSpecs with every time in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.traces.builders import HEADERS, MURI_STAGES, write_trace
from traces import TraceError, load_trace

# (case id, dialect, row overrides, expected format, expected overhead, expected JobSpec fields)
NORMALISATION: list[tuple[str, str, dict[str, str], str, str, dict[str, Any]]] = [
    (
        "muri: ms -> s, ms/iter -> s/iter, no 1.015 calibration",
        "muri",
        {},
        "muri",
        "muri",
        {
            "job_id": "0",
            "gpus": 8,
            "submit_time_s": 201694.0,
            "iterations": 8787693,
            "model": "dqn",
            "batch_size": 128,
            "duration_s": 4472936.0,
            "iteration_time_s": 0.509,
            "stage_times_s": (0.435, 0.008, 0.0005),
            "priority": 1,
            "deadline_s": None,
            "tenant": "default",
        },
    ),
    (
        "tiresias: seconds, iteration time = duration / iterations",
        "tiresias",
        {},
        "tiresias",
        "none",
        {
            "gpus": 8,
            "submit_time_s": 30.0,
            "iterations": 133,
            "model": "vgg11",
            "duration_s": 147.0,
            "iteration_time_s": pytest.approx(147 / 133),
            "batch_size": None,
            "stage_times_s": None,
        },
    ),
    (
        "elasticflow: ddl is the absolute deadline",
        "elasticflow",
        {},
        "elasticflow",
        "elasticflow",
        {
            "gpus": 8,
            "submit_time_s": 3717550.0,
            "iterations": 1548,
            "model": "ncf",
            "deadline_s": 3717583.0,
            "batch_size": 32768,
            "duration_s": 66.0,
            "iteration_time_s": pytest.approx(66 / 1548),
            "best_effort": False,
        },
    ),
    (
        "elasticflow with best_effort column",
        "elasticflow-best-effort",
        {"best_effort": "1"},
        "elasticflow",
        "elasticflow",
        {"best_effort": True, "deadline_s": 3717583.0},
    ),
    (
        "elasticflow philly variant uses iteration/duration, not real_*",
        "elasticflow-philly",
        {"iteration": "1000", "duration": "500", "real_iteration": "7", "real_duration": "9"},
        "elasticflow",
        "elasticflow",
        {"iterations": 1000, "duration_s": 500.0, "iteration_time_s": 0.5},
    ),
    (
        "itp: submission_time/num_iteration/deadline",
        "itp",
        {"job_id": "23b8c1e9-3924-56de-3eb1-3b9046685257"},
        "itp",
        "elasticflow",
        {
            "job_id": "23b8c1e9-3924-56de-3eb1-3b9046685257",
            "submit_time_s": 3717550.0,
            "iterations": 48266,
            "model": "inception3",
            "deadline_s": 3720405.0,
            "batch_size": 64,
            "gpus": 8,
            "duration_s": 3604.0,
            "iteration_time_s": pytest.approx(3604 / 48266),
        },
    ),
    (
        "itp raw: one-second synthetic iterations, unknown model",
        "itp-raw",
        {"duration": "604"},
        "itp-raw",
        "elasticflow",
        {
            "iterations": 604,
            "iteration_time_s": 1.0,
            "model": "unknown",
            "gpus": 16,
            "submit_time_s": 2266647.0,
            "duration_s": 604.0,
            "deadline_s": None,
            "batch_size": None,
        },
    ),
    (
        "itp raw: fractional duration rounds the iteration count",
        "itp-raw",
        {"duration": "2.6"},
        "itp-raw",
        "elasticflow",
        {"iterations": 3, "iteration_time_s": pytest.approx(2.6 / 3)},
    ),
    (
        "itp raw: sub-second job still gets one iteration",
        "itp-raw",
        {"duration": "0.4"},
        "itp-raw",
        "elasticflow",
        {"iterations": 1, "iteration_time_s": 0.4},
    ),
    (
        "philly: cluster is the tenant, id from the line, flat 30 s restarts",
        "philly",
        {"duration": "2951.0", "num_gpus": "4", "gpu_time": "11804.0", "cluster": "6214e9"},
        "philly",
        "flat:30",
        {
            "job_id": "philly-2",
            "tenant": "6214e9",
            "model": "unknown",
            "gpus": 4,
            "submit_time_s": 0.0,
            "iterations": 2951,
            "iteration_time_s": 1.0,
            "duration_s": 2951.0,
        },
    ),
]


@pytest.mark.parametrize(
    ("dialect", "row", "fmt", "overhead", "expected"),
    [case[1:] for case in NORMALISATION],
    ids=[case[0] for case in NORMALISATION],
)
def test_units_are_normalised_to_seconds(
    tmp_path: Path,
    dialect: str,
    row: dict[str, str],
    fmt: str,
    overhead: str,
    expected: dict[str, Any],
) -> None:
    trace = load_trace(write_trace(tmp_path, dialect, [row]))
    assert (trace.format, trace.default_overhead) == (fmt, overhead)
    [job] = trace.jobs
    actual = {field: getattr(job, field) for field in expected}
    assert actual == expected


@pytest.mark.parametrize(
    "dialect", ["tiresias", "elasticflow", "elasticflow-philly", "itp", "itp-raw", "philly"]
)
def test_derived_iteration_time_preserves_the_recorded_duration(
    tmp_path: Path, dialect: str
) -> None:
    # Formats without a per-iteration time must not change how long a job runs solo.
    [job] = load_trace(write_trace(tmp_path, dialect, [{"duration": "1234.5"}])).jobs
    assert job.work_s == pytest.approx(1234.5)
    assert job.duration_s == 1234.5


def test_muri_without_stage_columns_has_no_stage_times(tmp_path: Path) -> None:
    columns = [c for c in HEADERS["muri"] if c not in MURI_STAGES]
    trace = load_trace(write_trace(tmp_path, "muri", [{}], columns=columns))
    assert trace.format == "muri"
    assert trace.jobs[0].stage_times_s is None
    assert trace.jobs[0].iteration_time_s == 0.509


def test_muri_priority_column_is_optional(tmp_path: Path) -> None:
    columns = [c for c in HEADERS["muri"] if c != "priority"]
    trace = load_trace(write_trace(tmp_path, "muri", [{"priority": "1"}], columns=columns))
    assert trace.jobs[0].priority == 0


def test_philly_submit_times_are_offsets_from_the_earliest_row(tmp_path: Path) -> None:
    # Rows are out of order, as in Pollux's philly.csv; the earliest is on line 3.
    path = write_trace(
        tmp_path,
        "philly",
        [
            {"timestamp": "2017-10-09 07:01:55"},
            {"timestamp": "2017-10-09 06:13:03"},
            {"timestamp": "2017-10-10 06:13:03"},
            {"timestamp": "2017-10-09 06:13:03"},
        ],
    )
    trace = load_trace(path)
    assert [(j.job_id, j.submit_time_s) for j in trace.jobs] == [
        ("philly-3", 0.0),
        ("philly-5", 0.0),
        ("philly-2", 2932.0),
        ("philly-4", 86400.0),
    ]


def test_philly_trailing_blank_line_is_ignored(tmp_path: Path) -> None:
    # The real philly.csv ends with an empty line.
    path = tmp_path / "philly.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\n")  # fmt: skip
    assert len(load_trace(path).jobs) == 1


def test_jobs_are_sorted_by_submit_time_and_ties_keep_file_order(tmp_path: Path) -> None:
    submits = ["5000", "1000", "5000", "0", "1000"]
    path = write_trace(tmp_path, "muri", [{"submit_time": s} for s in submits])
    jobs = load_trace(path).jobs
    assert [j.job_id for j in jobs] == ["3", "1", "4", "0", "2"]
    assert [j.submit_time_s for j in jobs] == [0.0, 1.0, 1.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        ("muri", "muri"),
        ("tiresias", "tiresias"),
        ("elasticflow", "elasticflow"),
        ("elasticflow-best-effort", "elasticflow"),
        ("elasticflow-philly", "elasticflow"),
        ("itp", "itp"),
        ("itp-raw", "itp-raw"),
        ("philly", "philly"),
    ],
)
def test_format_is_detected_from_header_not_file_name(
    tmp_path: Path, dialect: str, expected: str
) -> None:
    # A misleading name and extension must not matter.
    path = write_trace(tmp_path, dialect, [{}], name="tiresias_60_job.txt")
    trace = load_trace(path)
    assert trace.format == expected
    assert trace.name == "tiresias_60_job"
    assert trace.path == path


def test_detection_ignores_column_order_and_line_endings(tmp_path: Path) -> None:
    columns = list(reversed(HEADERS["tiresias"]))
    path = write_trace(tmp_path, "tiresias", [{"num_gpu": "4"}], columns=columns, newline="\n")
    trace = load_trace(path)
    assert trace.format == "tiresias"
    assert trace.jobs[0].gpus == 4


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = write_trace(tmp_path, "itp-raw", [{}])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load_trace(path).format == "itp-raw"


def test_integral_floats_are_accepted_as_integers(tmp_path: Path) -> None:
    path = write_trace(tmp_path, "tiresias", [{"num_gpu": "4.0", "iterations": "100.0"}])
    job = load_trace(path).jobs[0]
    assert (job.gpus, job.iterations) == (4, 100)


def test_header_only_file_is_an_empty_trace(tmp_path: Path) -> None:
    trace = load_trace(write_trace(tmp_path, "philly", []))
    assert trace.jobs == ()
    assert trace.format == "philly"


@pytest.mark.parametrize(
    "header",
    [
        "job_id,gpus,submit",
        ",".join((*HEADERS["muri"], "user")),  # an extra, unknown column
        ",".join(HEADERS["itp-raw"][:3]),  # a required column missing
    ],
)
def test_unknown_header_names_seen_columns_and_known_formats(tmp_path: Path, header: str) -> None:
    path = tmp_path / "weird.csv"
    path.write_text(header + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.line, err.field) == (1, None)
    assert str(err).startswith("weird.csv line 1: unrecognised header (")
    assert f"({header.replace(',', ', ')})" in err.message
    for fmt in ("muri", "tiresias", "elasticflow", "itp", "itp-raw", "philly"):
        assert f"{fmt} (" in err.message


def test_partial_muri_stage_columns_are_rejected(tmp_path: Path) -> None:
    columns = [c for c in HEADERS["muri"] if c != "resource_time_2"]
    path = write_trace(tmp_path, "muri", [{}], columns=columns)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (1, "resource_time_2")
