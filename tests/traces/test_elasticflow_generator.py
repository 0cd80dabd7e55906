"""The ElasticFlow trace generator: byte-identical to the artifact, its distributions, its file."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from traces import load_trace
from traces.elasticflow_generator import (
    HEADER,
    JOB_TABLE,
    ElasticFlowJob,
    elasticflow_line,
    generate_elasticflow_jobs,
    main,
    write_elasticflow_trace,
)
from traces.scaling import load_scaling

SAMPLES = Path(__file__).resolve().parent / "data" / "elasticflow"
ROOT = Path(__file__).resolve().parents[2]


def test_job_table_is_the_artifacts() -> None:
    assert len(JOB_TABLE) == 14
    assert [(t.model, t.batch_size) for t in JOB_TABLE[-4:]] == [
        ("bert", 128), ("bert", 64), ("deepspeech2", 64), ("deepspeech2", 32)
    ]  # fmt: skip
    a100 = load_scaling("A100")
    for t in JOB_TABLE:  # every template has an A100 profile at every count the draw can give
        assert set(a100.curve(t.model, t.batch_size) or {}) >= {1, 2, 4, 8, 16}


@pytest.mark.parametrize(
    ("sample", "args"),
    [
        ("generate_trace_n40_lam1500_seed0.csv", {"num_jobs": 40, "lam": 1500, "seed": 0}),
        (
            "generate_trace_n40_lam600_seed3_s8_ddl1-2_be0.3_p.csv",
            {"num_jobs": 40, "lam": 600, "seed": 3, "max_scale_factor": 8, "min_ddl": 1.0,
             "max_ddl": 2.0, "best_effort_percentage": 0.3, "multi_priority": True},
        ),
    ],
)  # fmt: skip
def test_reproduces_the_artifacts_files(
    sample: str, args: dict[str, object], tmp_path: Path
) -> None:
    # Written by ElasticFlow's generate_trace.py with random.seed(seed + 4) (see the README).
    jobs = generate_elasticflow_jobs(**args)  # type: ignore[arg-type]
    ours = write_elasticflow_trace(jobs, tmp_path / "ours.csv")
    assert ours.read_bytes() == (SAMPLES / sample).read_bytes()


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    def run(seed: int, name: str) -> bytes:
        jobs = generate_elasticflow_jobs(300, 600, seed, best_effort_percentage=0.5)
        return write_elasticflow_trace(jobs, tmp_path / name).read_bytes()

    assert run(3, "a") == run(3, "b")
    assert run(3, "a") != run(4, "c")


def test_distributions() -> None:
    n = 5000
    jobs = generate_elasticflow_jobs(
        n, 1500, 11, min_ddl=0.8, max_ddl=2.0, best_effort_percentage=0.3
    )
    gpus = Counter(j.num_gpu for j in jobs)
    for count, share in {1: 0.83, 2: 0.03, 4: 0.03, 8: 0.10, 16: 0.01}.items():
        assert gpus[count] / n == pytest.approx(share, abs=0.015)
    gaps = [b.arrival_time_s - a.arrival_time_s for a, b in itertools.pairwise(jobs)]
    assert jobs[0].arrival_time_s == 0.0 and min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(1500, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1500, rel=0.1)  # exponential: sd = mean
    durations = [j.duration_s for j in jobs]
    assert min(durations) >= 600 and max(durations) <= 600_000
    assert sum(d > 60 * 10**2.5 for d in durations) / n == pytest.approx(0.2, abs=0.02)
    for j in jobs:
        assert 0.8 <= j.deadline_factor <= 2.0
        assert j.deadline_s == j.arrival_time_s + int(j.deadline_factor * j.duration_s)
    assert sum(j.best_effort for j in jobs) / n == pytest.approx(0.3, abs=0.02)
    assert Counter(j.template for j in jobs).keys() == set(JOB_TABLE)


def test_iterations_are_duration_times_the_rate_at_the_gpu_count() -> None:
    table = load_scaling("A100")
    for j in generate_elasticflow_jobs(300, 100, 5):
        curve = table.curve(j.model, j.template.batch_size)
        assert curve is not None
        assert j.total_steps == int(j.duration_s * curve[j.num_gpu])


@pytest.mark.parametrize(
    ("kwargs", "gpu_counts"),
    [
        ({"max_scale_factor": 4}, {1, 2, 4}),
        ({"max_scale_factor": 1}, {1}),
        ({"multi_gpu": False}, {1}),
    ],
)
def test_gpu_count_options(kwargs: dict[str, object], gpu_counts: set[int]) -> None:
    jobs = generate_elasticflow_jobs(1000, 60, 1, **kwargs)  # type: ignore[arg-type]
    assert {j.num_gpu for j in jobs} == gpu_counts


def test_single_gpu_jobs_keep_every_other_draw() -> None:
    # The GPU counts have their own stream: turning them off changes nothing else.
    def strip(jobs: list[ElasticFlowJob]) -> list[tuple[object, ...]]:
        return [(j.template, j.arrival_time_s, j.deadline_s, j.best_effort) for j in jobs]

    single = generate_elasticflow_jobs(200, 60, 2, multi_gpu=False)
    assert strip(single) == strip(generate_elasticflow_jobs(200, 60, 2))
    assert single == generate_elasticflow_jobs(200, 60, 2, max_scale_factor=1)


def test_lam_zero_puts_every_job_at_zero() -> None:
    assert {j.arrival_time_s for j in generate_elasticflow_jobs(100, 0, 3)} == {0.0}


def test_round_trip_through_load_trace(tmp_path: Path) -> None:
    jobs = generate_elasticflow_jobs(400, 1500, 0, best_effort_percentage=0.3)
    trace = load_trace(write_elasticflow_trace(jobs, tmp_path / "gen.csv"))
    assert trace.format == "elasticflow"
    assert [
        (s.job_id, s.model, s.batch_size, s.gpus, s.iterations, s.submit_time_s, s.deadline_s,
         s.duration_s, s.best_effort)
        for s in trace.jobs
    ] == [
        (str(j.job_id), j.model, j.template.batch_size, j.num_gpu, j.total_steps,
         float(int(j.arrival_time_s)), float(int(j.deadline_s)), float(int(j.duration_s)),
         j.best_effort)
        for j in jobs
    ]  # fmt: skip


def test_line_format_matches_the_artifacts() -> None:
    job = ElasticFlowJob(7, JOB_TABLE[-1], 8, 1234.9, 4321, 99.99, 1.2, 1580.99, True)
    assert elasticflow_line(job) == "7,99,4321,deepspeech2,1580,32,8,1234,1\n"
    assert HEADER.startswith("job_id,submit_time,iteration,model_name,ddl,")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_jobs": -1}, "num_jobs >= 0"),
        ({"lam": -5.0}, "lam >= 0"),
        ({"lam": float("inf")}, "lam >= 0"),
        ({"max_scale_factor": 0}, "max_scale_factor must be at least 1"),
        ({"min_ddl": -0.1}, "0 <= min_ddl <= max_ddl"),
        ({"min_ddl": 2.0, "max_ddl": 1.0}, "0 <= min_ddl <= max_ddl"),
        ({"best_effort_percentage": 1.5}, r"best_effort_percentage must be in \[0, 1\]"),
        ({"gpu_type": "V100"}, "known types are A100, T4"),
        # The artifact's job table has no T4 profile; its generator asserts on the first job.
        ({"gpu_type": "T4"}, r"deepspeech2 \(batch size 32\) on 1 GPU\(s\): no T4 throughput"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], fragment: str) -> None:
    args: dict[str, object] = {"num_jobs": 5, "lam": 10.0, **kwargs}
    with pytest.raises(ValueError, match=fragment):
        generate_elasticflow_jobs(**args)  # type: ignore[arg-type]


def test_main_writes_the_same_file(tmp_path: Path) -> None:
    out = tmp_path / "cli.csv"
    argv = ["--num-jobs", "40", "--lam", "600", "--seed", "3", "-s", "8", "--min-ddl", "1",
            "--max-ddl", "2", "--best-effort-percentage", "0.3", "--multi-priority",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    sample = SAMPLES / "generate_trace_n40_lam600_seed3_s8_ddl1-2_be0.3_p.csv"
    assert out.read_bytes() == sample.read_bytes()


def test_main_rejects_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--num-jobs", "5", "--gpu-type", "T4", "--out", str(tmp_path / "x")])
    assert info.value.code == 2
    assert "no T4 throughput" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_runs_as_a_module(tmp_path: Path) -> None:
    out = tmp_path / "m.csv"
    subprocess.run(
        [sys.executable, "-m", "traces.elasticflow_generator", "--num-jobs", "10", "--lam",
         "1500", "--out", str(out)],
        check=True, cwd=ROOT,
    )  # fmt: skip
    assert len(load_trace(out).jobs) == 10
