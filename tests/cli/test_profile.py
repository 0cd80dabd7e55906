"""`loom profile` output, its readers (`loom sim --profile`, `--overhead profile:FILE`)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from domain.overhead import parse_overhead
from loom.cli import main
from loom.profile import Point, ProfileOptions, gpu_counts, summarise, write_profile
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from tests.builders import make_job
from traces.errors import TraceError
from traces.measured import load_measured, with_measured
from traces.throughputs import load_throughputs

# --- builders ----------------------------------------------------------------------------------


def point(model: str = "cnn", gpus: int = 1, rate: float = 50.0, restart: float = 3.0,
          resize: float | None = None) -> Point:
    it = 1.0 / rate
    return Point(model, gpus, rate, 0.1 * it, 0.8 * it, 0.1 * it if gpus > 1 else 0.0, it,
                 start_s=restart - 0.5, restart_s=restart, stop_s=0.2,
                 resize_from=gpus // 2 if gpus > 1 else None, resize_s=resize)


def write_points(out: Path, points: list[Point], **opts: object) -> ProfileOptions:
    options = ProfileOptions(models=tuple(sorted({p.model for p in points})), out=out,
                             **opts)  # type: ignore[arg-type]
    out.mkdir(parents=True, exist_ok=True)
    write_profile(options, points)
    return options


TWO_SIZES = [point("cnn", 1, 50.0, 3.0), point("cnn", 2, 80.0, 5.0, resize=6.0),
             point("transformer", 1, 8.0, 7.0), point("transformer", 2, 10.0, 9.0, resize=11.0)]


# --- sizes and options ---------------------------------------------------------------------------


@pytest.mark.parametrize(("max_gpus", "counts"), [
    (1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]),
])
def test_sizes_double_up_to_the_maximum(max_gpus: int, counts: list[int]) -> None:
    assert gpu_counts(max_gpus) == counts


@pytest.mark.parametrize(("change", "message"), [
    ({"models": ("cnn", "bogus")}, "unknown bogus"),
    ({"models": ()}, "nothing given"),
    ({"max_gpus": 0}, "--max-gpus 0"),
    ({"max_gpus": 4, "batch_size": 30}, "--batch-size 30 must be divisible"),
    ({"seconds": 0}, "--seconds"),
    ({"data": {"lstm": "/tmp"}}, "lstm is not being profiled"),
    ({"data": {"cnn": "/no/such/dir"}}, "/no/such/dir: no such file"),
])
def test_bad_options_name_the_flag(tmp_path: Path, change: dict[str, object],
                                   message: str) -> None:
    fields: dict[str, object] = {"models": ("cnn",), "out": tmp_path, **change}
    with pytest.raises(ValueError, match=message):
        ProfileOptions(**fields).validate()  # type: ignore[arg-type]


def test_summary_is_the_median_with_its_range() -> None:
    rows = summarise([point(rate=40.0, restart=2.0), point(rate=50.0, restart=9.0),
                      point(rate=45.0, restart=3.0)])
    row = rows["cnn"][1]
    assert row["repeats"] == 3
    assert row["iterations_per_s"] == 45.0 and row["iterations_per_s_range"] == [40.0, 50.0]
    assert row["restart_s"] == 3.0 and row["restart_s_range"] == [2.0, 9.0]
    assert "resize_s" not in row


# --- the files and their readers -----------------------------------------------------------------


def test_tables_are_in_elasticflow_and_gavel_format(tmp_path: Path) -> None:
    write_points(tmp_path, TWO_SIZES, device="cpu")
    assert (tmp_path / "throughputs" / "cnn.csv").read_text().splitlines() == [
        "global_batch_size,1,2", "32,50.0,80.0"]
    gavel = load_throughputs(tmp_path / "throughputs.json")
    assert gavel.rates("transformer", 2, ("cpu",)) == {"cpu": 10.0}
    measured = load_measured(tmp_path)
    assert measured.scaling.curve("cnn", 32) == {1: 50.0, 2: 80.0}
    data, compute, comm = measured.stages["cnn"][2]
    assert comm > 0 and data + compute + comm == pytest.approx(1 / 80.0)
    overheads = json.loads((tmp_path / "overheads.json").read_text())["workloads"]
    assert overheads["cnn"]["resize_s"] == {"1->2": 6.0}


@pytest.mark.parametrize(("model", "gpus", "expected"), [
    ("cnn", 1, 3.0), ("cnn", 2, 5.0), ("resnet18", 2, 5.0),  # a trace name maps to its family
    ("cnn", 3, 5.0),  # between profiled sizes: the nearest below
    ("transformer", 1, 7.0), ("gpt2", 1, 7.0),
    ("a2c", 1, 9.0),  # not profiled: the largest restart in the file, never free
])
def test_profile_overhead_charges_the_measured_restart(tmp_path: Path, model: str, gpus: int,
                                                       expected: float) -> None:
    write_points(tmp_path, TWO_SIZES)
    model_ = parse_overhead(f"profile:{tmp_path / 'overheads.json'}")
    job = make_job("j").model(model).gpus(gpus).build()
    assert model_.restart(job) == expected
    assert model_.per_event(job) == 0.0 and not model_.charges_per_event


def _write(text: str) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        (tmp / "o.json").write_text(text)
        return tmp / "o.json"
    return build


OVERHEAD_ERRORS = [
    ("missing", lambda t: t / "nope.json", "cannot read"),
    ("not json", _write("{"), "invalid JSON at line 1"),
    ("no format", _write('{"workloads": {}}'), "loom.overheads.v1"),
    ("no workloads", _write('{"format": "loom.overheads.v1", "workloads": {}}'),
     "must map a workload"),
    ("bad count", _write('{"format": "loom.overheads.v1", "workloads": {"cnn": '
                         '{"restart_s": {"zero": 1}}}}'), r"restart_s\['zero'\]"),
    ("negative", _write('{"format": "loom.overheads.v1", "workloads": {"cnn": '
                        '{"restart_s": {"1": -2}}}}'), "finite seconds >= 0"),
]


@pytest.mark.parametrize(("case", "build", "message"), OVERHEAD_ERRORS,
                         ids=[c[0] for c in OVERHEAD_ERRORS])
def test_bad_overhead_files_say_what_is_wrong(tmp_path: Path, case: str,
                                             build: Callable[[Path], Path],
                                             message: str) -> None:
    path = build(tmp_path)
    with pytest.raises(ValueError, match=message) as err:
        parse_overhead(f"profile:{path}")
    assert str(path) in str(err.value)


def _batch(job: JobSpec, size: int) -> JobSpec:
    return job.model_copy(update={"batch_size": size})


def test_measured_speeds_replace_the_trace_constants(tmp_path: Path) -> None:
    write_points(tmp_path, TWO_SIZES)
    profile = load_measured(tmp_path)
    jobs = [_batch(make_job("a").model("cnn").gpus(2).iteration_time(9.0).build(), 32),
            make_job("b").model("vgg16").gpus(1).iteration_time(9.0).build(),  # batch unset: 32
            make_job("c").model("a2c").gpus(1).iteration_time(9.0).build(),  # not profiled
            _batch(make_job("d").model("cnn").gpus(1).iteration_time(9.0).build(), 64)]
    a, b, c, d = with_measured(jobs, profile)
    assert a.iteration_time_s == 1 / 80.0 and a.scaling == {1: 50.0, 2: 80.0}
    assert a.gpu_levels == (2,)  # speeds for every size, but the job keeps its request
    assert a.stage_times_s == profile.stages["cnn"][2]
    assert b.iteration_time_s == 1 / 50.0
    assert c == jobs[2] and d == jobs[3]  # unprofiled model / batch: the trace's constants


def test_a_job_larger_than_the_profile_is_refused(tmp_path: Path) -> None:
    write_points(tmp_path, TWO_SIZES)
    with pytest.raises(TraceError, match="asks for 4 GPUs; cnn is profiled at \\[1, 2\\]"):
        with_measured([make_job("big").model("cnn").gpus(4).build()], load_measured(tmp_path))


def test_not_a_profile_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no throughputs/"):
        load_measured(tmp_path)


def _one_node(tmp: Path) -> Path:
    path = tmp / "cluster.json"
    path.write_text(ClusterSpec.uniform(1, 1, 2, gpu_type="fake", name="one").model_dump_json())
    return path


def _trace(tmp: Path, rows: list[str]) -> Path:
    path = tmp / "mix.csv"
    path.write_text("job_id,submit_time,iteration,model_name,ddl,batch_size,num_gpu,duration\n"
                    + "\n".join(rows) + "\n")
    return path


def test_loom_sim_runs_on_the_measured_profile(tmp_path: Path) -> None:
    """JCT = measured restart + iterations at the measured rate; the queued job waits."""
    write_points(tmp_path / "prof", TWO_SIZES)
    trace = _trace(tmp_path, ["a,0,500,cnn,99999,32,2,1", "b,0,80,transformer,99999,32,1,1"])
    code = main(["sim", "--trace", str(trace), "--cluster", str(_one_node(tmp_path)),
                 "--policy", "fifo", "--profile", str(tmp_path / "prof"),
                 "--out", str(tmp_path / "run")])
    assert code == 0
    rows = (tmp_path / "run" / "jobs.csv").read_text().splitlines()
    header = rows[0].split(",")
    jct = {r.split(",")[0]: float(r.split(",")[header.index("jct_s")]) for r in rows[1:]}
    assert jct["a"] == pytest.approx(5.0 + 500 / 80.0)
    assert jct["b"] == pytest.approx(jct["a"] + 7.0 + 80 / 8.0)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["overhead"].startswith("profile:")


# --- a real profile ------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the torch extra")
def test_loom_profile_measures_real_trainers_and_sim_reads_it(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    assert main(["profile", "--models", "rl", "--max-gpus", "2", "--seconds", "0.3",
                 "--probe", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "profile.json").read_text())["summary"]["rl"]
    assert set(summary) == {"1", "2"}
    for row in summary.values():
        assert row["iterations_per_s"] > 0 and row["restart_s"] >= 0
        # Each figure is a median of its own, so their sum may pass the median iteration by
        # a little; a stage counted twice would pass it by far more.
        assert row["data_s"] + row["compute_s"] + row["comm_s"] <= 1.1 * row["iteration_s"]
    assert summary["2"]["comm_s"] > 0 and summary["2"]["resize_from"] == 1
    assert "resize_s" in summary["2"]
    trace = _trace(tmp_path, ["a,0,100,a2c,99999,32,2,1"])
    assert main(["sim", "--trace", str(trace), "--cluster", str(_one_node(tmp_path)),
                 "--policy", "fifo", "--profile", str(out), "--out", str(tmp_path / "run")]) == 0


def test_the_bench_mix_simulates_as_fifo_on_two_gpus(tmp_path: Path) -> None:
    """bench/sim_vs_live.py's simulated side: its trace, cluster and FIFO order."""
    from bench.sim_vs_live import MIX, simulate

    write_points(tmp_path / "prof", TWO_SIZES)
    jct = simulate(tmp_path / "prof", MIX, tmp_path)
    a, b, c, d = (j.job_id for j in MIX)  # submitted 10 ms apart
    end_b = 0.01 + 7.0 + 80 / 8.0
    end_c = end_b + 5.0 + 600 / 80.0  # needs both GPUs: starts when b (the later) ends
    end_d = end_c + 7.0 + 60 / 8.0  # strict FIFO: no backfilling past c
    assert jct[a] == pytest.approx(3.0 + 500 / 50.0)
    assert jct[b] == pytest.approx(end_b - 0.01)
    assert jct[c] == pytest.approx(end_c - 0.02)
    assert jct[d] == pytest.approx(end_d - 0.03)
