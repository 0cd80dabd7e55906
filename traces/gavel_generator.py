"""Synthetic Gavel traces, drawn exactly as Gavel draws them, in Gavel's 10-field format.

Two of Gavel's (OSDI'20, github.com/stanford-futuredata/gavel) generators are reproduced
draw for draw, so a seed gives the same job types, steps, GPU counts, priorities and arrivals:

* `"trace"`: `scheduler/scripts/utils/generate_trace.py` (the default). Four `random.Random`
  streams seeded seed, seed+1, seed+2, seed+3 draw, per job: the template (seed), the GPU count
  if the template is distributed and multi-GPU jobs are on (seed+3: 1, 2 or 4 with
  probability .7/.1/.2), the duration (seed+2: one of `numpy.linspace(min_h, max_h, n)` hours),
  the priority (seed again: weight 5 with probability .2 if multi-priority is on), and, from the
  second job on, the gap to the previous arrival (seed+1: exponential with mean `lam` s).
* `"philly"`: the jobs `Scheduler.simulate` generates itself when run by
  `scripts/drivers/simulate_scheduler_with_generated_jobs.py` (`utils.generate_job` with its
  default Philly-fitted distributions). One stream seeded seed+2 draws the GPU count (1/2/4/8
  with probability .7/.1/.15/.05, forced to 1 without multi-GPU jobs), the duration
  (60·10^U(1.5, 3) s with probability .8, else 60·10^U(3, 4) s), then templates until one
  fits the GPU count, then the priority; the gaps come from a stream seeded seed+3.

Steps are duration x the V100 rate at the job's GPU count, truncated as Gavel's `%d` writes
them. Commands are placeholders (Gavel's simulator never runs them); every other column is
Gavel's, so one file feeds Gavel's `simulate_scheduler_with_trace.py` and Loom's `load_trace`.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from traces.throughputs import ThroughputTable, load_throughputs

Distribution = Literal["trace", "philly"]
DISTRIBUTIONS: tuple[Distribution, ...] = ("trace", "philly")
REFERENCE_TYPE = "v100"  # Gavel converts durations to steps on this GPU type


@dataclass(frozen=True)
class JobTemplate:
    """One workload of Gavel's job table (`scheduler/job_table.py`)."""

    job_type: str  # Gavel's name, also the throughput-profile key
    command: str
    working_directory: str
    num_steps_arg: str
    needs_data_dir: bool = True
    distributed: bool = False  # may run on more than one GPU


def _family(
    model: str, batches: Sequence[int], workdir: str, steps_arg: str, *, distributed: bool
) -> list[JobTemplate]:
    return [
        JobTemplate(
            f"{model} (batch size {b})",
            f"loom-placeholder {workdir} --batch-size {b}",
            workdir,
            steps_arg,
            distributed=distributed,
        )
        for b in batches
    ]


# Gavel's order matters: a template is drawn by index.
JOB_TABLE: tuple[JobTemplate, ...] = (
    *_family("ResNet-18", (16, 32, 64, 128, 256), "image_classification/cifar10",
             "--num_steps", distributed=True),
    *_family("ResNet-50", (16, 32, 64, 128), "image_classification/imagenet",
             "--num_minibatches", distributed=True),
    *_family("Transformer", (16, 32, 64, 128, 256), "translation", "-step", distributed=True),
    *_family("LM", (5, 10, 20, 40, 80), "language_modeling", "--steps", distributed=True),
    *_family("Recommendation", (512, 1024, 2048, 4096, 8192), "recommendation", "-n",
             distributed=False),
    JobTemplate("A3C", "loom-placeholder rl", "rl", "--max-steps", needs_data_dir=False),
    JobTemplate("CycleGAN", "loom-placeholder cyclegan", "cyclegan", "--n_steps"),
)  # fmt: skip


@dataclass(frozen=True)
class GavelJob:
    """A generated job; `duration_s` is on a V100 and `total_steps` is derived from it."""

    template: JobTemplate
    scale_factor: int
    duration_s: float
    total_steps: int
    priority_weight: float
    arrival_time_s: float
    slo: float | None = None  # multiple of the duration; Gavel's generators leave it unset

    @property
    def job_type(self) -> str:
        return self.template.job_type


def generate_gavel_jobs(
    num_jobs: int,
    lam: float,
    seed: int = 0,
    *,
    multi_gpu: bool = False,
    multi_priority: bool = False,
    durations_h: tuple[float, float, int] = (1.0, 4.0, 4),
    distribution: Distribution = "trace",
    throughputs: ThroughputTable | None = None,
) -> list[GavelJob]:
    """`num_jobs` jobs with mean inter-arrival `lam` seconds (0: all arrive at 0).

    `durations_h` is (min, max, count) of the evenly spaced durations in hours the `"trace"`
    distribution picks from (Gavel's -a, -b, -n); `"philly"` ignores it. `throughputs`
    defaults to Gavel's simulation profile.
    """
    if num_jobs < 0 or not lam >= 0 or not math.isfinite(lam):
        raise ValueError(f"need num_jobs >= 0 and a finite lam >= 0, got {num_jobs}, {lam}")
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, not {distribution!r}")
    low, high, count = durations_h
    if not (low > 0 and high > 0 and count >= 1):  # Gavel asserts a positive duration
        raise ValueError(f"durations_h needs min, max > 0 and count >= 1, got {durations_h}")
    table = throughputs if throughputs is not None else load_throughputs()
    draw: _Draws = _TraceDraws(seed, durations_h) if distribution == "trace" else _PhillyDraws(seed)
    jobs: list[GavelJob] = []
    arrival = 0.0
    for i in range(num_jobs):
        template, gpus, duration = draw.job(multi_gpu)
        weight = 1.0
        # Gavel's generate_job: the priority comes from the job stream, after the duration.
        if multi_priority and 0.0 <= draw.jobs.uniform(0, 1) <= 0.2:
            weight = 5.0
        if i > 0 and lam > 0:
            arrival = draw.next_arrival(arrival, lam)
        rate = table.rates(template.job_type, gpus, (REFERENCE_TYPE,))[REFERENCE_TYPE]
        steps = int(duration * rate)  # Gavel keeps the float but writes it with %d
        if steps < 1:
            raise ValueError(
                f"{template.job_type!r} at {gpus} GPU(s): {duration:g} s is under one step"
            )
        jobs.append(GavelJob(template, gpus, duration, steps, weight, arrival))
    return jobs


class _Draws:
    """The random streams of one Gavel generator; `jobs` also draws priorities."""

    def __init__(self, job_seed: int, gap_seed: int) -> None:
        self.jobs = random.Random(job_seed)
        self.gaps = random.Random(gap_seed)

    def job(self, multi_gpu: bool) -> tuple[JobTemplate, int, float]:
        """(template, GPUs, duration in seconds) of the next job."""
        raise NotImplementedError

    def next_arrival(self, previous: float, lam: float) -> float:
        raise NotImplementedError


class _TraceDraws(_Draws):
    """generate_trace.py: templates and priorities (seed), gaps (seed+1), durations (seed+2),
    GPU counts (seed+3)."""

    def __init__(self, seed: int, durations_h: tuple[float, float, int]) -> None:
        super().__init__(seed, seed + 1)
        self.durations = random.Random(seed + 2)
        self.scales = random.Random(seed + 3)
        # The grid itself comes from numpy so every hour value is bit-identical to Gavel's.
        low, high, count = durations_h
        self.hours = [float(h) for h in np.linspace(low, high, count)]

    def job(self, multi_gpu: bool) -> tuple[JobTemplate, int, float]:
        template = self.jobs.choice(JOB_TABLE)
        gpus = 1
        if multi_gpu and template.distributed:
            r = self.scales.uniform(0, 1)
            gpus = 1 if r < 0.7 else 2 if r <= 0.8 else 4
        return template, gpus, 3600 * self.durations.choice(self.hours)

    def next_arrival(self, previous: float, lam: float) -> float:
        return previous + -math.log(1.0 - self.gaps.random()) * lam


class _PhillyDraws(_Draws):
    """Scheduler.simulate: everything about a job (seed+2), gaps (seed+3)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed + 2, seed + 3)

    def job(self, multi_gpu: bool) -> tuple[JobTemplate, int, float]:
        r = self.jobs.uniform(0, 1)  # drawn even when multi-GPU jobs are off
        gpus = 1 if r < 0.7 else 2 if r <= 0.8 else 4 if r <= 0.95 else 8
        if self.jobs.random() >= 0.8:
            duration = 60 * (10 ** self.jobs.uniform(3, 4))
        else:
            duration = 60 * (10 ** self.jobs.uniform(1.5, 3))
        if not multi_gpu:
            gpus = 1
        while True:  # redraw until the template can use the GPU count
            template = self.jobs.choice(JOB_TABLE)
            if gpus == 1 or template.distributed:
                return template, gpus, duration

    def next_arrival(self, previous: float, lam: float) -> float:
        # The scheduler divides by a rate of 1/lam, which can round differently from * lam.
        return -math.log(1.0 - self.gaps.random()) / (1.0 / lam) + previous


def gavel_line(job: GavelJob) -> str:
    """One line as Gavel's `Job.__str__` plus `\\t%d` arrival writes it (ints truncate)."""
    t = job.template
    slo = -1.0 if job.slo is None else job.slo
    return (
        f"{t.job_type}\t{t.command}\t{t.working_directory}\t{t.num_steps_arg}\t"
        f"{int(t.needs_data_dir)}\t{job.total_steps}\t{job.scale_factor}\t"
        f"{int(job.priority_weight)}\t{slo:f}\t{int(job.arrival_time_s)}\n"
    )


def write_gavel_trace(jobs: Iterable[GavelJob], path: str | Path) -> Path:
    """Write `jobs` in Gavel's 10-field format, readable by Gavel and by `load_trace`."""
    out = Path(path)
    with out.open("w", encoding="utf-8", newline="\n") as f:
        f.writelines(gavel_line(job) for job in jobs)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m traces.gavel_generator --num-jobs 400 --lam 150 --seed 0 -m --out FILE`."""
    parser = argparse.ArgumentParser(
        prog="python -m traces.gavel_generator",
        description="Write a synthetic trace exactly as Gavel's generators draw it.",
    )
    parser.add_argument("--num-jobs", type=int, required=True)
    parser.add_argument(
        "-l",
        "--lam",
        type=float,
        default=0.0,
        help="mean inter-arrival time in seconds (0: every job at time 0)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-a", "--min-duration", type=float, default=1.0, help="hours")
    parser.add_argument("-b", "--max-duration", type=float, default=4.0, help="hours")
    parser.add_argument("-n", "--num-durations", type=int, default=4)
    parser.add_argument("-m", "--multi-gpu", action="store_true")
    parser.add_argument("--multi-priority", action="store_true")
    parser.add_argument(
        "--distribution",
        choices=DISTRIBUTIONS,
        default="trace",
        help="trace: generate_trace.py; philly: the simulator's own jobs",
    )
    parser.add_argument(
        "--throughputs",
        type=Path,
        default=None,
        help="throughput profile JSON (default: Gavel's simulation profile)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        jobs = generate_gavel_jobs(
            args.num_jobs,
            args.lam,
            args.seed,
            multi_gpu=args.multi_gpu,
            multi_priority=args.multi_priority,
            durations_h=(args.min_duration, args.max_duration, args.num_durations),
            distribution=args.distribution,
            throughputs=load_throughputs(args.throughputs) if args.throughputs else None,
        )
    except (ValueError, KeyError) as exc:  # TraceError: bad profile; KeyError: unprofiled job
        parser.error(str(exc))
    write_gavel_trace(jobs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
