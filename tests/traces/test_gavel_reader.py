"""The Gavel reader: both tab-separated layouts, speeds from a throughput profile, errors."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from traces import TraceError, bundled_traces, load_trace
from traces.throughputs import ThroughputTable, load_throughputs

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
FIELDS = {
    "gavel": (
        "job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir",
        "total_steps", "scale_factor", "priority_weight", "SLO", "arrival_time",
    ),
    "gavel-msr": (
        "job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps",
        "arrival_time", "scale_factor",
    ),
}  # fmt: skip
# One real row of each layout: physical_cluster/artifact_evaluation.trace line 1 and
# msr/seed=0/0e4a51.trace line 1.
DEFAULTS = {
    "gavel": {
        "job_type": "ResNet-50 (batch size 64)",
        "command": "python3 main.py -j 2 -a resnet50 -b 64 %s/imagenet/",
        "working_directory": "image_classification/imagenet",
        "num_steps_arg": "--num_minibatches",
        "needs_data_dir": "1",
        "total_steps": "2931",
        "scale_factor": "1",
        "priority_weight": "1",
        "SLO": "-1.000000",
        "arrival_time": "0",
    },
    "gavel-msr": {
        "job_type": "Transformer (batch size 128)",
        "command": "cd %s/gpusched/workloads/pytorch/translation && python3 train.py -data "
        "%s/data/translation/multi30k.atok.low.pt -batch_size 128 -proj_share_weight",
        "num_steps_arg": "-step",
        "needs_data_dir": "1",
        "total_steps": "95121",
        "arrival_time": "0.000000",
        "scale_factor": "1",
    },
}


def gavel_text(layout: str, rows: Sequence[Mapping[str, str]], eol: str = "\n") -> str:
    """Tab-separated lines, each a set of overrides of the layout's real row."""
    return "".join(
        "\t".join({**DEFAULTS[layout], **row}[f] for f in FIELDS[layout]) + eol for row in rows
    )


def write(tmp_path: Path, text: str, name: str = "jobs.trace") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def write_profile(tmp_path: Path, rates: Mapping[str, Mapping[tuple[str, int], float]]) -> Path:
    """A throughputs JSON in Gavel's layout: GPU type -> "('<job type>', <GPUs>)" -> null rate."""
    raw = {
        gpu: {f"('{job}', {n})": {"null": rate} for (job, n), rate in jobs.items()}
        for gpu, jobs in rates.items()
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.fixture(scope="module")
def profile() -> ThroughputTable:
    return load_throughputs()


def speeds(table: ThroughputTable, job_type: str, gpus: int) -> dict[str, float]:
    return table.rates(job_type, gpus, ("k80", "p100", "v100"))


# (case id, layout, row overrides, expected JobSpec fields; callables get the profile)
CASES: list[tuple[str, str, dict[str, str], dict[str, Any]]] = [
    (
        "10 fields: steps, GPUs, speeds of the job at its GPU count, V100 as reference",
        "gavel",
        {"scale_factor": "2", "arrival_time": "120"},
        {
            "job_id": "0",
            "job_type": "ResNet-50 (batch size 64)",
            "model": "ResNet-50",
            "batch_size": 64,
            "gpus": 2,
            "iterations": 2931,
            "weight": 1.0,
            "submit_time_s": 120.0,
            "deadline_s": None,
            "priority": 0,
            "duration_s": None,
            "throughputs": lambda t: speeds(t, "ResNet-50 (batch size 64)", 2),
            "iteration_time_s": lambda t: 1 / speeds(t, "ResNet-50 (batch size 64)", 2)["v100"],
        },
    ),
    (
        "10 fields: priority weight and an SLO in multiples of the V100 duration",
        "gavel",
        {"priority_weight": "5", "SLO": "2.5", "arrival_time": "100"},
        {
            "weight": 5.0,
            "deadline_s": lambda t: pytest.approx(
                100 + 2.5 * 2931 / speeds(t, "ResNet-50 (batch size 64)", 1)["v100"]
            ),
        },
    ),
    ("10 fields: SLO 0 means none", "gavel", {"SLO": "0"}, {"deadline_s": None}),
    (
        "10 fields: a job type without a batch size",
        "gavel",
        {"job_type": "A3C", "needs_data_dir": "0"},
        {"model": "A3C", "batch_size": None, "job_type": "A3C"},
    ),
    (
        "7 fields (msr): weight 1, no deadline, 1-GPU speeds",
        "gavel-msr",
        {"scale_factor": "4", "arrival_time": "6.000000"},
        {
            "job_type": "Transformer (batch size 128)",
            "model": "Transformer",
            "batch_size": 128,
            "gpus": 4,
            "iterations": 95121,
            "submit_time_s": 6.0,
            "weight": 1.0,
            "deadline_s": None,
            "throughputs": lambda t: speeds(t, "Transformer (batch size 128)", 1),
        },
    ),
    (
        "7 fields (msr): GPU counts nobody profiled still load",
        "gavel-msr",
        {"job_type": "CycleGAN", "scale_factor": "32"},
        {"gpus": 32, "model": "CycleGAN", "throughputs": lambda t: speeds(t, "CycleGAN", 1)},
    ),
]


@pytest.mark.parametrize(
    ("layout", "row", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rows_become_job_specs(
    tmp_path: Path,
    profile: ThroughputTable,
    layout: str,
    row: dict[str, str],
    expected: dict[str, Any],
) -> None:
    trace = load_trace(write(tmp_path, gavel_text(layout, [row])))
    assert (trace.format, trace.default_overhead) == (layout, "none")
    [job] = trace.jobs
    want = {k: v(profile) if callable(v) else v for k, v in expected.items()}
    assert {k: getattr(job, k) for k in want} == want


def test_speeds_cover_the_real_gpu_types_only(tmp_path: Path) -> None:
    [job] = load_trace(write(tmp_path, gavel_text("gavel", [{}]))).jobs
    assert job.throughputs is not None
    assert set(job.throughputs) == {"k80", "p100", "v100"}  # no *_unconsolidated


def test_job_ids_are_row_indexes_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    rows = gavel_text("gavel", [{"arrival_time": str(t)} for t in (0, 0, 30, 30, 45)], "\r\n")
    lines = rows.split("\r\n")
    text = "\r\n".join([*lines[:2], "", *lines[2:]])  # a blank line 3, CRLF line ends
    trace = load_trace(write(tmp_path, text))
    assert [(j.job_id, j.submit_time_s) for j in trace.jobs] == [
        ("0", 0.0), ("1", 0.0), ("2", 30.0), ("3", 30.0), ("4", 45.0),
    ]  # fmt: skip


def test_format_is_detected_from_content_not_name(tmp_path: Path) -> None:
    path = write(tmp_path, gavel_text("gavel-msr", [{}]), name="muri_trace.csv")
    trace = load_trace(path)
    assert (trace.format, trace.name, len(trace.jobs)) == ("gavel-msr", "muri_trace", 1)


def test_an_explicit_profile_replaces_the_default(tmp_path: Path) -> None:
    table = load_throughputs(
        write_profile(
            tmp_path,
            {
                "v100": {("Big Model (batch size 8)", 2): 0.0},
                "k80": {("Big Model (batch size 8)", 2): 0.5},
                "k80_unconsolidated": {("Big Model (batch size 8)", 2): 0.25},
            },
        )
    )
    rows = [{"job_type": "Big Model (batch size 8)", "scale_factor": "2", "SLO": "3"}]
    [job] = load_trace(write(tmp_path, gavel_text("gavel", rows)), throughputs=table).jobs
    assert (job.model, job.batch_size) == ("Big_Model", 8)  # made a valid name
    assert job.throughputs == {"v100": 0.0, "k80": 0.5}
    # No V100 speed: the fastest type becomes the reference for time and deadline.
    assert job.iteration_time_s == 2.0
    assert job.deadline_s == 3 * 2931 * 2.0


def test_profile_is_ignored_for_csv_traces(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submission_time,duration,num_gpu\na,0,10,1\n")
    assert load_trace(path, throughputs=None).format == "itp-raw"


# (layout, field, bad value, fragment of the message); the bad value goes into data line 3.
BAD_CELLS: list[tuple[str, str, str, str]] = [
    ("gavel", "total_steps", "many", "expected a positive integer, got 'many'"),
    ("gavel", "total_steps", "0", "expected a positive integer, got '0'"),
    ("gavel", "total_steps", "1.5", "expected a positive integer, got '1.5'"),
    ("gavel", "scale_factor", "0", "expected a positive integer, got '0'"),
    ("gavel", "scale_factor", "-2", "expected a positive integer"),
    ("gavel", "scale_factor", "3", "'ResNet-50 (batch size 64)' is not profiled at 3 GPU(s)"),
    ("gavel", "job_type", "VGG-16 (batch size 32)", "unknown job type 'VGG-16 (batch size 32)'"),
    ("gavel", "job_type", "", "missing value"),
    ("gavel", "arrival_time", "-1", "expected a non-negative number, got '-1'"),
    ("gavel", "arrival_time", "soon", "expected a non-negative number, got 'soon'"),
    ("gavel", "priority_weight", "0", "expected a positive number, got '0'"),
    ("gavel", "SLO", "tight", "expected a number (-1 for none), got 'tight'"),
    ("gavel", "SLO", "inf", "expected a number (-1 for none), got 'inf'"),
    ("gavel", "needs_data_dir", "2", "expected 0 or 1, got '2'"),
    ("gavel-msr", "total_steps", "x", "expected a positive integer, got 'x'"),
    ("gavel-msr", "scale_factor", "0", "expected a positive integer, got '0'"),
    ("gavel-msr", "arrival_time", "-6.000000", "expected a non-negative number"),
    ("gavel-msr", "job_type", "GPT-3", "unknown job type 'GPT-3'"),
]


@pytest.mark.parametrize(
    ("layout", "field", "value", "fragment"),
    BAD_CELLS,
    ids=[f"{layout}-{field}-{value!r}" for layout, field, value, _ in BAD_CELLS],
)
def test_bad_cell_names_file_line_and_field(
    tmp_path: Path, layout: str, field: str, value: str, fragment: str
) -> None:
    path = write(tmp_path, gavel_text(layout, [{}, {}, {field: value}, {}]), name="bad.trace")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.path, err.line, err.field) == (path, 3, field)
    assert str(err).startswith(f"bad.trace line 3, field '{field}': ")
    assert fragment in err.message


def test_arrival_times_must_not_decrease(tmp_path: Path) -> None:
    rows = [{"arrival_time": t} for t in ("0", "100", "50")]
    path = write(tmp_path, gavel_text("gavel", rows), name="unsorted.trace")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == (
        "unsorted.trace line 3, field 'arrival_time': 50 is earlier than the previous job's "
        "100; Gavel traces must be in arrival order"
    )


def test_a_job_that_runs_nowhere_is_rejected(tmp_path: Path) -> None:
    table = load_throughputs(write_profile(tmp_path, {"v100": {("A3C", 1): 0.0}}))
    path = write(tmp_path, gavel_text("gavel", [{"job_type": "A3C"}]))
    with pytest.raises(TraceError) as info:
        load_trace(path, throughputs=table)
    assert (info.value.line, info.value.field) == (1, "job_type")
    assert "runs on no GPU type" in info.value.message


@pytest.mark.parametrize(
    ("layout", "cut", "field", "fragment"),
    [
        ("gavel", 1, "arrival_time", "expected 10 fields, got 9"),
        ("gavel", 4, "scale_factor", "expected 10 fields, got 6"),
        ("gavel-msr", 1, "scale_factor", "expected 7 fields, got 6"),
        ("gavel", -1, None, "expected 10 fields, got 11"),  # a long row has no culprit
    ],
)
def test_wrong_field_count(
    tmp_path: Path, layout: str, cut: int, field: str | None, fragment: str
) -> None:
    good = gavel_text(layout, [{}])
    cells = good.rstrip("\n").split("\t")
    bad = "\t".join(cells[:-cut] if cut > 0 else [*cells, "extra"]) + "\n"
    path = write(tmp_path, good + good + bad)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (3, field)
    assert fragment in info.value.message
    assert str(info.value).startswith("jobs.trace line 3")


def test_a_tab_separated_first_line_of_another_width_is_reported(tmp_path: Path) -> None:
    # No commas, so not a CSV header: a truncated Gavel trace, reported as such.
    path = write(tmp_path, "\nA3C\tcmd\t--max-steps\t0\t100\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (2, None)
    assert "expected 10 tab-separated fields (Gavel) or 7 (legacy msr), got 5" in str(info.value)


def test_non_utf8_gavel_file(tmp_path: Path) -> None:
    path = write(tmp_path, gavel_text("gavel", [{}]))
    path.write_bytes(path.read_bytes().replace(b"ResNet", b"Res\xffNet"))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (None, None)
    assert "not UTF-8" in info.value.message


GAVEL_TRACES = {t.name: t for t in bundled_traces() if t.name.startswith("gavel/")}
EXPECTED_JOBS = {
    "gavel/msr/0e4a51": 1181, "gavel/msr/103959": 986, "gavel/msr/11cb48": 2000,
    "gavel/msr/23dbec": 9, "gavel/msr/2869ce": 533, "gavel/msr/51b7ef": 18,
    "gavel/msr/6214e9": 2000, "gavel/msr/6c71a0": 2000, "gavel/msr/795a4c": 3,
    "gavel/msr/7f04ca": 972, "gavel/msr/925e2b": 4, "gavel/msr/b436b2": 2000,
    "gavel/msr/e13805": 607, "gavel/msr/ed69ec": 951, "gavel/msr/ee9e8c": 2000,
    "gavel/physical/artifact_evaluation": 15, "gavel/physical/debug": 14,
    "gavel/physical/debug_v2": 14, "gavel/physical/highmem_test": 8,
    "gavel/physical/max_min_fairness": 96, "gavel/physical/medium_test": 20,
    "gavel/physical/minimize_makespan": 100, "gavel/physical/small_test": 20,
}  # fmt: skip


def test_bundled_gavel_names() -> None:
    assert sorted(GAVEL_TRACES) == sorted(EXPECTED_JOBS)
    assert sum(n for name, n in EXPECTED_JOBS.items() if "/msr/" in name) == 15_264


@pytest.mark.parametrize(("name", "count"), EXPECTED_JOBS.items())
def test_bundled_gavel_trace_loads(name: str, count: int) -> None:
    trace = load_trace(name)
    assert trace.format == GAVEL_TRACES[name].format  # the registry agrees with detection
    assert trace.path == GAVEL_TRACES[name].path
    assert [j.job_id for j in trace.jobs] == [str(i) for i in range(count)]  # file order


def test_msr_spot_values_match_the_file(profile: ThroughputTable) -> None:
    # 11cb48.trace line 1017: "CycleGAN\t<command>\t--n_steps\t1\t38959\t5273249.000000\t16"
    job = load_trace("gavel/msr/11cb48").jobs[1016]
    assert (job.job_id, job.job_type, job.iterations, job.submit_time_s, job.gpus) == (
        "1016", "CycleGAN", 38959, 5273249.0, 16,
    )  # fmt: skip
    assert job.throughputs == speeds(profile, "CycleGAN", 1)  # CycleGAN is never distributed


def test_gavel_data_is_attributed() -> None:
    assert "MIT License" in (DATA / "gavel" / "LICENSE").read_text()
    attribution = (DATA / "ATTRIBUTION.md").read_text()
    section = attribution.split("## `gavel/`", 1)[1].split("\n## ", 1)[0]
    assert "Licence: MIT" in section
    assert "commit `c4fa400`" in section
