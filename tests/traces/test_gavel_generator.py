"""The Gavel trace generator: draw-for-draw equal to Gavel's, its distributions, its file."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from traces import load_trace
from traces.gavel_generator import (
    JOB_TABLE,
    GavelJob,
    gavel_line,
    generate_gavel_jobs,
    main,
    write_gavel_trace,
)
from traces.throughputs import ThroughputTable, load_throughputs

SAMPLES = Path(__file__).resolve().parent / "data" / "gavel"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profile() -> ThroughputTable:
    return load_throughputs()


def test_job_table_is_gavels(profile: ThroughputTable) -> None:
    assert len(JOB_TABLE) == 26
    assert {t.job_type for t in JOB_TABLE} == set(profile.job_types)
    distributed = {t.job_type.split(" (")[0] for t in JOB_TABLE if t.distributed}
    assert distributed == {"ResNet-18", "ResNet-50", "Transformer", "LM"}
    assert [t.job_type for t in JOB_TABLE if not t.needs_data_dir] == ["A3C"]
    assert all("\t" not in t.command and "\n" not in t.command for t in JOB_TABLE)


def _columns_without_command(text: str) -> list[list[str]]:
    return [line.split("\t")[:1] + line.split("\t")[2:] for line in text.splitlines()]


def test_reproduces_gavels_generate_trace(tmp_path: Path, profile: ThroughputTable) -> None:
    # Written by Gavel: generate_trace.py --num_jobs 50 -l 150 --seed 0 -m
    # --generate-multi-priority-jobs. Every column but the command must be identical.
    gavel = (SAMPLES / "generate_trace_n50_lam150_seed0_m_p.trace").read_text()
    jobs = generate_gavel_jobs(50, 150, 0, multi_gpu=True, multi_priority=True, throughputs=profile)
    ours = write_gavel_trace(jobs, tmp_path / "ours.trace").read_text()
    assert _columns_without_command(ours) == _columns_without_command(gavel)


def test_reproduces_the_jobs_gavels_simulator_generates(profile: ThroughputTable) -> None:
    # The first 50 jobs Gavel's simulator generated (seed 0, lam 150, -m, multi-priority),
    # as its --output_trace_file_name writes them: arrival times with six decimals.
    lines = (SAMPLES / "simulator_philly_n50_lam150_seed0_m_p.trace").read_text().splitlines()
    jobs = generate_gavel_jobs(
        50, 150, 0, multi_gpu=True, multi_priority=True, distribution="philly",
        throughputs=profile,
    )  # fmt: skip
    # Gavel writes these arrivals with %f instead of %d; every other column is the same.
    ours = [[*gavel_line(j).split("\t")[:-1], f"{j.arrival_time_s:f}"] for j in jobs]
    assert _columns_without_command("\n".join("\t".join(c) for c in ours)) == (
        _columns_without_command("\n".join(lines))
    )


@pytest.mark.parametrize("distribution", ["trace", "philly"])
def test_same_arguments_same_jobs(profile: ThroughputTable, distribution: str) -> None:
    def run(seed: int) -> list[GavelJob]:
        return generate_gavel_jobs(
            300, 60, seed, multi_gpu=True, multi_priority=True,
            distribution="trace" if distribution == "trace" else "philly", throughputs=profile,
        )  # fmt: skip

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_trace_distribution(profile: ThroughputTable) -> None:
    n = 4000
    jobs = generate_gavel_jobs(n, 150, 11, multi_gpu=True, multi_priority=True, throughputs=profile)
    assert {j.duration_s for j in jobs} == {3600.0, 7200.0, 10800.0, 14400.0}
    for j in jobs[:200]:
        rate = profile.rates(j.job_type, j.scale_factor, ("v100",))["v100"]
        assert j.total_steps == int(j.duration_s * rate)
    assert all(j.scale_factor == 1 for j in jobs if not j.template.distributed)
    scales = Counter(j.scale_factor for j in jobs if j.template.distributed)
    total = sum(scales.values())
    assert set(scales) == {1, 2, 4}
    for gpus, share in {1: 0.7, 2: 0.1, 4: 0.2}.items():
        assert scales[gpus] / total == pytest.approx(share, abs=0.03)
    assert sum(j.priority_weight == 5.0 for j in jobs) / n == pytest.approx(0.2, abs=0.02)
    assert {j.priority_weight for j in jobs} == {1.0, 5.0}


def test_philly_distribution(profile: ThroughputTable) -> None:
    n = 4000
    jobs = generate_gavel_jobs(
        n, 150, 11, multi_gpu=True, multi_priority=True, distribution="philly",
        throughputs=profile,
    )  # fmt: skip
    scales = Counter(j.scale_factor for j in jobs)
    for gpus, share in {1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}.items():
        assert scales[gpus] / n == pytest.approx(share, abs=0.02)
    assert all(j.template.distributed for j in jobs if j.scale_factor > 1)
    durations = [j.duration_s for j in jobs]
    assert min(durations) >= 60 * 10**1.5 and max(durations) <= 60 * 10**4
    long = sum(d > 60 * 10**3 for d in durations) / n
    assert long == pytest.approx(0.2, abs=0.02)


@pytest.mark.parametrize("distribution", ["trace", "philly"])
def test_arrivals_are_poisson_with_mean_gap_lam(
    profile: ThroughputTable, distribution: str
) -> None:
    jobs = generate_gavel_jobs(
        4000, 150, 2, distribution="trace" if distribution == "trace" else "philly",
        throughputs=profile,
    )  # fmt: skip
    arrivals = [j.arrival_time_s for j in jobs]
    assert arrivals[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(150, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(150, rel=0.1)  # exponential: sd = mean


def test_defaults_single_gpu_single_priority_all_at_zero(profile: ThroughputTable) -> None:
    jobs = generate_gavel_jobs(500, 0, 1, throughputs=profile)
    assert {(j.scale_factor, j.priority_weight, j.arrival_time_s) for j in jobs} == {(1, 1.0, 0.0)}


def test_round_trip_through_a_file(tmp_path: Path, profile: ThroughputTable) -> None:
    jobs = generate_gavel_jobs(
        400, 150, 0, multi_gpu=True, multi_priority=True, throughputs=profile
    )
    trace = load_trace(write_gavel_trace(jobs, tmp_path / "gen.trace"), throughputs=profile)
    assert trace.format == "gavel"
    assert [
        (s.job_id, s.job_type, s.gpus, s.iterations, s.weight, s.submit_time_s, s.deadline_s)
        for s in trace.jobs
    ] == [
        (str(i), j.job_type, j.scale_factor, j.total_steps, j.priority_weight,
         float(int(j.arrival_time_s)), None)
        for i, j in enumerate(jobs)
    ]  # fmt: skip


def test_line_format_matches_gavels_job_str() -> None:
    template = JOB_TABLE[-2]  # A3C: no data directory
    job = GavelJob(template, 1, 3600.0, 1234, 5.0, 299.99, slo=1.5)
    assert gavel_line(job) == (
        f"A3C\t{template.command}\trl\t--max-steps\t0\t1234\t1\t5\t1.500000\t299\n"
    )
    unset = GavelJob(template, 1, 3600.0, 1234, 1.0, 0.0)
    assert gavel_line(unset).endswith("\t1\t1\t-1.000000\t0\n")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_jobs": -1}, "num_jobs >= 0"),
        ({"lam": -5.0}, "lam >= 0"),
        ({"lam": float("nan")}, "lam >= 0"),
        ({"durations_h": (0.0, 4.0, 4)}, "min, max > 0"),
        ({"durations_h": (1.0, 4.0, 0)}, "count >= 1"),
        ({"durations_h": (1e-9, 1e-9, 1)}, "under one step"),
        ({"distribution": "uniform"}, "distribution must be one of"),
    ],
)
def test_bad_arguments(profile: ThroughputTable, kwargs: dict[str, object], fragment: str) -> None:
    args: dict[str, object] = {"num_jobs": 5, "lam": 10.0, "throughputs": profile, **kwargs}
    with pytest.raises(ValueError, match=fragment):
        generate_gavel_jobs(**args)  # type: ignore[arg-type]


def test_main_writes_the_same_file(tmp_path: Path, profile: ThroughputTable) -> None:
    out = tmp_path / "cli.trace"
    argv = ["--num-jobs", "40", "--lam", "150", "--seed", "0", "--multi-gpu", "--out", str(out)]
    assert main(argv) == 0
    expected = write_gavel_trace(
        generate_gavel_jobs(40, 150, 0, multi_gpu=True, throughputs=profile), tmp_path / "x"
    )
    assert out.read_bytes() == expected.read_bytes()


def test_main_rejects_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--num-jobs", "5", "--lam", "-1", "--out", str(tmp_path / "x")])
    assert info.value.code == 2
    assert "lam >= 0" in capsys.readouterr().err


def test_runs_as_a_module(tmp_path: Path) -> None:
    out = tmp_path / "m.trace"
    subprocess.run(
        [sys.executable, "-m", "traces.gavel_generator", "--num-jobs", "10", "--lam", "150",
         "--distribution", "philly", "-m", "--out", str(out)],
        check=True, cwd=ROOT,
    )  # fmt: skip
    assert len(load_trace(out).jobs) == 10
