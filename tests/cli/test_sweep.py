"""`loom sweep` (Gavel's steady-state load sweep) and `loom gen-trace`."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from loom.cli import main
from loom.sweep import default_window, window_jct
from schemas.job import JobState
from services.metrics.outcomes import JobOutcome
from traces import load_trace
from traces.elasticflow_generator import main as ef_generator_main
from traces.gavel_generator import main as generator_main

POLICIES = ("fifo-perf", "max-min-fairness-perf")
RATES = (0.5, 1.0)  # jobs per hour
SEEDS = (0, 1)
SWEEP = ["sweep", "--policies", ",".join(POLICIES), "--rates", "0.5,1", "--seeds", "0,1",
         "--cluster", "4:4:4", "--gpus-per-server", "4", "--jobs", "30", "--processes", "2"]


@dataclass(frozen=True)
class Swept:
    out: Path
    stdout: str
    rows: list[dict[str, str]]


def _sweep(out: Path) -> Swept:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):  # capsys is per test; this sweep is per module
        assert main([*SWEEP, "--out", str(out), "--save-traces"]) == 0
    with (out / "sweep.csv").open() as f:
        return Swept(out, stdout.getvalue(), list(csv.DictReader(f)))


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Swept:
    """One sweep shared by the tests that only read its outputs."""
    return _sweep(tmp_path_factory.mktemp("sweep"))


def test_sweep_writes_one_plausible_row_per_run(swept: Swept) -> None:
    keys = [(r["policy"], float(r["rate_jobs_per_h"]), int(r["seed"])) for r in swept.rows]
    assert keys == [(p, r, s) for p in POLICIES for r in RATES for s in SEEDS]
    for r in swept.rows:
        assert r["jobs"] == "30" and r["window"] == "10:20"  # the middle third by default
        assert 0 < float(r["avg_jct_window_s"]) < float(r["makespan_s"])
        assert float(r["avg_jct_all_s"]) > 0 and 0 < float(r["utilization"]) <= 1
        assert float(r["wall_s"]) > 0
    png = (swept.out / "jct_vs_load.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    saved = sorted(p.name for p in (swept.out / "traces").iterdir())
    assert saved == sorted(f"rate{r:g}-seed{s}.trace" for r in RATES for s in SEEDS)


def test_window_jct_is_the_mean_over_job_ids_in_the_window(swept: Swept, tmp_path: Path) -> None:
    # Recompute one run from its saved trace: jobs are numbered in arrival order from 0.
    trace = load_trace(swept.out / "traces" / "rate0.5-seed0.trace")
    assert [j.job_id for j in trace.jobs] == [str(i) for i in range(30)]
    assert main(["sim", "--trace", str(swept.out / "traces" / "rate0.5-seed0.trace"),
                 "--cluster", "4:4:4", "--policy", "fifo-perf", "--seed", "0",
                 "--out", str(tmp_path)]) == 0
    with (tmp_path / "jobs.csv").open() as f:
        jcts = [float(j["jct_s"]) for j in csv.DictReader(f) if 10 <= int(j["job_id"]) < 20]
    row = swept.rows[0]
    assert (row["policy"], row["rate_jobs_per_h"], row["seed"]) == ("fifo-perf", "0.5", "0")
    assert float(row["avg_jct_window_s"]) == pytest.approx(sum(jcts) / len(jcts), abs=1e-5)


def test_table_and_json_match_the_csv(swept: Swept) -> None:
    lines = swept.stdout.splitlines()
    header = next(line for line in lines if "jobs/h" in line)
    assert header.index(POLICIES[0]) < header.index(POLICIES[1])
    table_rows = [re.findall(r"[\d.]+", line) for line in lines if line.startswith("│")]
    assert [float(r[0]) for r in table_rows] == list(RATES)
    for (rate, *cells) in table_rows:
        for policy, cell in zip(POLICIES, cells, strict=True):
            seeds = [float(r["avg_jct_window_s"]) for r in swept.rows
                     if r["policy"] == policy and float(r["rate_jobs_per_h"]) == float(rate)]
            assert float(cell) == pytest.approx(sum(seeds) / len(seeds) / 3600, abs=0.005)
    doc = json.loads((swept.out / "sweep.json").read_text())
    assert doc["command"].startswith("loom sweep --policies fifo-perf,max-min-fairness-perf")
    assert doc["sweep"]["window"] == [10, 20] and doc["sweep"]["distribution"] == "philly"
    assert len(doc["runs"]) == len(swept.rows)
    for run, row in zip(doc["runs"], swept.rows, strict=True):
        assert run["policy"] == row["policy"] and run["seed"] == int(row["seed"])
        assert run["avg_jct_window_s"] == pytest.approx(float(row["avg_jct_window_s"]), abs=1e-5)


def test_the_same_sweep_twice_gives_the_same_values(swept: Swept, tmp_path: Path) -> None:
    again = _sweep(tmp_path)

    def values(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]

    assert values(again.rows) == values(swept.rows)
    for name in ("rate1-seed1.trace", "rate0.5-seed0.trace"):
        assert (again.out / "traces" / name).read_bytes() == (
            swept.out / "traces" / name).read_bytes()


@pytest.mark.parametrize(
    ("jobs", "window"),
    [(30, (10, 20)), (1000, (333, 666)), (6000, (2000, 4000)), (3, (1, 2)), (2, (0, 1)),
     (1, (0, 1))],
)
def test_default_window_is_the_middle_third(jobs: int, window: tuple[int, int]) -> None:
    assert default_window(jobs) == window


def _outcome(job_id: int, end: float | None) -> JobOutcome:
    state = JobState.RUNNING if end is None else JobState.FINISHED
    return JobOutcome(job_id=str(job_id), tenant="t", model="m", gpus=1, submit_s=10.0 * job_id,
                      deadline_s=None, best_effort=False, state=state, end_s=end)


@pytest.mark.parametrize(
    ("ends", "window", "expected"),
    [
        ({0: 100.0, 1: 110.0, 2: 140.0, 3: 1000.0}, (1, 3), (110.0, 0)),  # (100 + 120) / 2
        ({0: 100.0, 1: 110.0, 2: None, 3: 1000.0}, (1, 3), (None, 1)),  # never flatter
        ({0: 100.0, 1: None}, (0, 1), (100.0, 0)),  # unfinished jobs outside do not count
    ],
)
def test_window_jct(
    ends: dict[int, float | None], window: tuple[int, int], expected: tuple[float | None, int]
) -> None:
    assert window_jct([_outcome(i, end) for i, end in ends.items()], window) == expected


SMALL = ["sweep", "--policies", "fifo-perf", "--rates", "1", "--cluster", "4:4:4",
         "--jobs", "30"]


def _with(flag: str, value: str) -> list[str]:
    argv = list(SMALL)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (_with("--rates", "0"), "--rates: '0' must be a positive number of jobs per hour"),
        (_with("--rates", "-2"), "--rates: '-2' must be a positive"),
        (_with("--rates", "x"), "--rates: 'x' is not a number"),
        (_with("--rates", "1,,2"), "--rates: '' is not a number"),
        (_with("--rates", "inf"), "--rates: 'inf' is not a finite number"),
        (_with("--rates", "1,1.0"), "--rates lists a value twice"),
        (_with("--seeds", "0,a"), "--seeds: 'a' is not an integer"),
        (_with("--window", "20:40"), "--window 20:40 is outside the job IDs 0..29 (--jobs 30)"),
        (_with("--window", "5:5"), "--window 5:5 is outside the job IDs"),
        (_with("--window", "0:31"), "need 0 <= START < END <= 30"),
        ([*SMALL, "--window=-1:5"], "--window -1:5 is outside the job IDs"),
        (_with("--window", "12"), "--window: expected START:END job IDs, got '12'"),
        (_with("--window", "a:9"), "--window: 'a' is not an integer"),
        (_with("--jobs", "0"), "--jobs must be at least 1"),
        (_with("--policies", "fifo-perf,nope"), "--policies: unknown policy 'nope'"),
        (_with("--policies", "fifo-perf,fifo-perf"), "--policies lists a value twice"),
        (_with("--cluster", "n99g99"), "n99g99"),
        (_with("--processes", "-1"), "--processes must be 0"),
    ],
)
def test_bad_sweep_input_exits_2_naming_the_option(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split())
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_gen_trace_writes_a_gavel_trace_that_loads(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "g.trace"
    assert main(["gen-trace", "gavel", "--jobs", "25", "--rate", "4", "--seed", "3",
                 "--multi-gpu", "--out", str(path)]) == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 25 and all(len(line.split("\t")) == 10 for line in lines)
    trace = load_trace(path)
    assert trace.format == "gavel" and [j.job_id for j in trace.jobs] == [str(i) for i in range(25)]


@pytest.mark.parametrize(
    ("loom_args", "generator_args"),
    [
        (["--rate", "4"], ["--lam", "900"]),  # 3600 / 4 jobs per hour
        (["--lam", "0", "--seed", "2"], ["--lam", "0", "--seed", "2"]),
        (["--lam", "1200", "--multi-gpu", "--multi-priority"],
         ["--lam", "1200", "-m", "--multi-priority"]),
        (["--rate", "2", "--distribution", "philly", "--seed", "7"],
         ["--lam", "1800", "--distribution", "philly", "--seed", "7"]),
    ],
)
def test_gen_trace_is_deterministic_and_matches_the_generator(
    loom_args: list[str], generator_args: list[str], tmp_path: Path
) -> None:
    files = []
    for i in range(2):
        files.append(tmp_path / f"loom{i}.trace")
        assert main(["gen-trace", "gavel", "--jobs", "40", *loom_args,
                     "--out", str(files[-1])]) == 0
    reference = tmp_path / "reference.trace"
    assert generator_main(["--num-jobs", "40", *generator_args, "--out", str(reference)]) == 0
    assert files[0].read_bytes() == files[1].read_bytes() == reference.read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lam", "-5"], "--lam: '-5' must be 0 or more seconds"),
        (["--lam", "soon"], "--lam: 'soon' is not a number"),
        (["--rate", "0"], "--rate: '0' must be a positive number of jobs per hour"),
        (["--rate", "1", "--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_bad_gen_trace_input_exits_2_naming_the_option(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["gen-trace", "gavel", "--jobs", "10", *args, "--out", str(tmp_path / "t.trace")]
    assert main(argv) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "t.trace").exists()


def test_gen_trace_needs_exactly_one_of_lam_and_rate(tmp_path: Path) -> None:
    for arrivals in ([], ["--lam", "10", "--rate", "2"]):
        with pytest.raises(SystemExit) as exc:
            main(["gen-trace", "gavel", "--jobs", "5", *arrivals, "--out", str(tmp_path / "t")])
        assert exc.value.code == 2


@pytest.mark.parametrize(
    "command",
    [
        ["sweep", "--policies", "fifo-perf", "--rates", "1", "--cluster", "4:4:4",
         "--jobs", "30"],
        ["gen-trace", "gavel", "--jobs", "30", "--rate", "1"],
    ],
)
@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (None, "missing.json: cannot read throughputs file"),
        ({"v100": {"('A3C', 1)": {"null": 10.0}}}, "--throughputs: job type"),  # A3C only
    ],
)
def test_bad_throughputs_exit_2_and_write_nothing(
    command: list[str], profile: dict[str, object] | None, message: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "missing.json"
    if profile is not None:
        path = tmp_path / "a3c.json"
        path.write_text(json.dumps(profile))
    assert main([*command, "--throughputs", str(path), "--out", str(tmp_path / "out")]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()


EF_SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "data" / "elasticflow"


@pytest.mark.parametrize(
    ("loom_args", "generator_args"),
    [
        (["--lam", "1500", "--seed", "0"], ["--lam", "1500", "--seed", "0"]),
        (["--rate", "6", "--seed", "3", "--max-gpus", "8", "--min-ddl", "1", "--max-ddl", "2",
          "--best-effort", "0.3", "--multi-priority"],
         ["--lam", "600", "--seed", "3", "-s", "8", "--min-ddl", "1", "--max-ddl", "2",
          "--best-effort-percentage", "0.3", "--multi-priority"]),
        (["--lam", "0", "--seed", "5", "--gpu-type", "A100", "--multi-gpu"],
         ["--lam", "0", "--seed", "5", "--gpu-type", "A100"]),
    ],
)  # fmt: skip
def test_gen_trace_elasticflow_is_deterministic_and_matches_the_generator(
    loom_args: list[str], generator_args: list[str], tmp_path: Path
) -> None:
    files = []
    for i in range(2):
        files.append(tmp_path / f"loom{i}.csv")
        assert main(["gen-trace", "elasticflow", "--jobs", "40", *loom_args,
                     "--out", str(files[-1])]) == 0
    reference = tmp_path / "reference.csv"
    assert ef_generator_main(["--num-jobs", "40", *generator_args, "--out", str(reference)]) == 0
    assert files[0].read_bytes() == files[1].read_bytes() == reference.read_bytes()


def test_gen_trace_elasticflow_reproduces_the_artifact_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ef.csv"
    assert main(["gen-trace", "elasticflow", "--jobs", "40", "--lam", "1500", "--seed", "0",
                 "--out", str(path)]) == 0
    assert path.read_bytes() == (EF_SAMPLES / "generate_trace_n40_lam1500_seed0.csv").read_bytes()
    trace = load_trace(path)
    assert trace.format == "elasticflow" and [j.job_id for j in trace.jobs] == [
        str(i) for i in range(40)
    ]
    assert all(j.deadline_s is not None and j.deadline_s >= j.submit_time_s for j in trace.jobs)


@pytest.mark.parametrize(
    ("generator", "args", "message"),
    [
        ("elasticflow", ["--best-effort", "1.5"], "--best-effort: '1.5' must be between 0 and 1"),
        ("elasticflow", ["--best-effort", "many"], "--best-effort: 'many' is not a number"),
        ("elasticflow", ["--min-ddl", "2", "--max-ddl", "1"], "need 0 <= 2 <= 1"),
        ("elasticflow", ["--min-ddl", "-1"], "need 0 <= -1 <= 1.5"),
        ("elasticflow", ["--max-gpus", "0"], "--max-gpus: 0 must be at least 1"),
        ("elasticflow", ["--gpu-type", "T4"],
         "--gpu-type T4: deepspeech2 (batch size 32) on 1 GPU(s): no T4 throughput"),
        ("elasticflow", ["--distribution", "philly"], "--distribution applies to gavel"),
        ("elasticflow", ["--throughputs", "x.json"], "--throughputs applies to gavel"),
        ("gavel", ["--min-ddl", "1"], "--min-ddl applies to elasticflow traces only"),
        ("gavel", ["--gpu-type", "A100"], "--gpu-type applies to elasticflow traces only"),
    ],
)  # fmt: skip
def test_bad_gen_trace_elasticflow_input_exits_2(
    generator: str, args: list[str], message: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "t.csv"
    argv = ["gen-trace", generator, "--jobs", "10", "--lam", "100", *args, "--out", str(out)]
    assert main(argv) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not out.exists()
