"""Synthetic ElasticFlow deadline traces, drawn exactly as ElasticFlow's generator draws them.

ElasticFlow's (ASPLOS'23, github.com/pkusys/ElasticFlow) `trace_generator/generate_trace.py`
is reproduced draw for draw. Five `random.Random` streams draw, per job:

* the GPU count (seed+3, only with multi-GPU jobs, the artifact's default): Microsoft ITP's
  1/2/4/8/16 with cut-offs .83/.86/.89/.99 on U(0, 1), capped at `max_scale_factor`;
* the job template (seed): one of the 14 entries of the artifact's `job_table.py`, by index;
* the duration (seed+2): 60·10^U(2.5, 4) s with probability .2, else 60·10^U(1, 2.5) s (the
  artifact's -a/-b/-n duration grid is computed but never used, so it is not an option);
* with multi-priority jobs, a priority draw (seed again) that the CSV does not record;
* from the second job on, the gap to the previous arrival (seed+1: exponential, mean `lam` s);
* the deadline factor U(min_ddl, max_ddl), then the best-effort coin U(0, 1) < share (seed+4).

The last stream is Loom's: the artifact draws those two from Python's unseeded global `random`,
so its traces cannot be regenerated. With the global generator seeded `seed + 4` before the
artifact's `main`, both give byte-identical files (checked against the artifact at commit
`04a0109`; see tests/traces/data/elasticflow/README.md).

Iterations are duration × the whole job's iterations/s at its GPU count in ElasticFlow's
throughput table (`traces.scaling`), truncated as the artifact's `%d` writes them; the deadline
is the arrival plus the truncated factor × duration. The artifact reads its throughput folder
with `os.listdir`, but only to fill a dict it looks templates up in by name: the drawn model
comes from the job table's fixed order, so the listing order cannot change a trace.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from traces.scaling import GPU_TYPES, ScalingTable, load_scaling

HEADER = "job_id,submit_time,iteration,model_name,ddl,batch_size,num_gpu,duration,best_effort\n"
MAX_SCALE_FACTOR = 16  # the artifact asserts every GPU count is at most 16


@dataclass(frozen=True)
class JobTemplate:
    """One entry of ElasticFlow's job table: the model (throughput file stem), batch size."""

    model: str
    batch_size: int


def _family(model: str, batches: Sequence[int]) -> list[JobTemplate]:
    return [JobTemplate(model, b) for b in batches]


# The artifact's order matters: a template is drawn by index. Every entry is distributed.
JOB_TABLE: tuple[JobTemplate, ...] = (
    *_family("resnet50", (64, 128, 256)),
    *_family("vgg16", (64, 128, 256)),
    *_family("inception3", (64, 128)),
    *_family("gpt2", (128, 256)),
    *_family("bert", (128, 64)),
    *_family("deepspeech2", (64, 32)),
)


@dataclass(frozen=True)
class ElasticFlowJob:
    """A generated job; times in seconds. The CSV truncates every number but the factor."""

    job_id: int
    template: JobTemplate
    num_gpu: int
    duration_s: float
    total_steps: int
    arrival_time_s: float
    deadline_factor: float  # U(min_ddl, max_ddl); the deadline is this × duration after arrival
    deadline_s: float
    best_effort: bool

    @property
    def model(self) -> str:
        return self.template.model


def generate_elasticflow_jobs(
    num_jobs: int,
    lam: float,
    seed: int = 0,
    *,
    gpu_type: str = "A100",
    max_scale_factor: int = MAX_SCALE_FACTOR,
    min_ddl: float = 0.5,
    max_ddl: float = 1.5,
    best_effort_percentage: float = 0.0,
    multi_gpu: bool = True,
    multi_priority: bool = False,
) -> list[ElasticFlowJob]:
    """`num_jobs` jobs with mean inter-arrival `lam` seconds (0: all arrive at 0).

    `gpu_type` picks ElasticFlow's throughput table (A100 or T4). The artifact's job table only
    has A100 profiles, so with T4 the first job fails, as the artifact's assertion does.
    """
    if num_jobs < 0 or not lam >= 0 or not math.isfinite(lam):
        raise ValueError(f"need num_jobs >= 0 and a finite lam >= 0, got {num_jobs}, {lam}")
    if max_scale_factor < 1:
        raise ValueError(f"max_scale_factor must be at least 1, got {max_scale_factor}")
    if not (0 <= min_ddl <= max_ddl and math.isfinite(max_ddl)):
        raise ValueError(f"need 0 <= min_ddl <= max_ddl, got {min_ddl}, {max_ddl}")
    if not 0 <= best_effort_percentage <= 1:
        raise ValueError(f"best_effort_percentage must be in [0, 1], got {best_effort_percentage}")
    table = load_scaling(gpu_type)
    draw = _Draws(seed)
    jobs: list[ElasticFlowJob] = []
    arrival = 0.0
    for i in range(num_jobs):
        gpus = draw.scale_factor(max_scale_factor) if multi_gpu else 1
        template = draw.jobs.choice(JOB_TABLE)
        duration = draw.duration()
        if multi_priority:
            draw.jobs.uniform(0, 1)  # the priority: never written, but it moves the stream
        steps = duration * _rate(table, template, gpus)
        if steps < 1:  # the artifact would write 0 iterations, which no reader accepts
            raise ValueError(
                f"{template.model} (batch size {template.batch_size}) on {gpus} GPU(s): "
                f"{duration:g} s is under one step"
            )
        if i > 0 and lam > 0:
            arrival += -math.log(1.0 - draw.gaps.random()) * lam
        factor = draw.deadlines.uniform(min_ddl, max_ddl)
        deadline = arrival + int(factor * duration)
        best_effort = draw.deadlines.uniform(0, 1) < best_effort_percentage
        jobs.append(ElasticFlowJob(
            i, template, gpus, duration, int(steps), arrival, factor, deadline, best_effort
        ))  # fmt: skip
    return jobs


def _rate(table: ScalingTable, template: JobTemplate, gpus: int) -> float:
    rate = (table.curve(template.model, template.batch_size) or {}).get(gpus)
    if rate is None:  # missing, zero or nan: the artifact's assertions fail on each
        raise ValueError(
            f"{template.model} (batch size {template.batch_size}) on {gpus} GPU(s): "
            f"no {table.gpu_type} throughput in ElasticFlow's table"
        )
    return rate


class _Draws:
    """The generator's streams: templates and priorities (seed), gaps (seed+1), durations
    (seed+2), GPU counts (seed+3), deadline factors and best-effort coins (seed+4)."""

    def __init__(self, seed: int) -> None:
        self.jobs = random.Random(seed)
        self.gaps = random.Random(seed + 1)
        self.durations = random.Random(seed + 2)
        self.scales = random.Random(seed + 3)
        self.deadlines = random.Random(seed + 4)

    def scale_factor(self, cap: int) -> int:
        r = self.scales.uniform(0, 1)
        # The artifact tests closed intervals in order: .86, .89 and .99 go to the smaller count.
        gpus = 1 if r < 0.83 else 2 if r <= 0.86 else 4 if r <= 0.89 else 8 if r <= 0.99 else 16
        return min(gpus, cap)

    def duration(self) -> float:
        if self.durations.random() >= 0.8:
            return 60 * (10 ** self.durations.uniform(2.5, 4))
        return 60 * (10 ** self.durations.uniform(1, 2.5))


def elasticflow_line(job: ElasticFlowJob) -> str:
    """One CSV row as the artifact's `%d,...` format writes it (floats truncate)."""
    t = job.template
    return (
        f"{job.job_id},{int(job.arrival_time_s)},{job.total_steps},{t.model},"
        f"{int(job.deadline_s)},{t.batch_size},{job.num_gpu},{int(job.duration_s)},"
        f"{int(job.best_effort)}\n"
    )


def write_elasticflow_trace(jobs: Iterable[ElasticFlowJob], path: str | Path) -> Path:
    """Write `jobs` as the artifact does, readable by ElasticFlow and by `load_trace`."""
    out = Path(path)
    with out.open("w", encoding="utf-8", newline="\n") as f:
        f.write(HEADER)
        f.writelines(elasticflow_line(job) for job in jobs)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m traces.elasticflow_generator --num-jobs 200 --lam 1500 --seed 0 --out FILE`."""
    parser = argparse.ArgumentParser(
        prog="python -m traces.elasticflow_generator",
        description="Write a deadline trace exactly as ElasticFlow's generator draws it "
        "(deadline factors and best-effort coins from a stream seeded seed+4).",
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
    parser.add_argument(
        "--gpu-type",
        choices=GPU_TYPES,
        default="A100",
        help="ElasticFlow throughput table (default A100)",
    )
    parser.add_argument(
        "-s",
        "--max-scale-factor",
        type=int,
        default=MAX_SCALE_FACTOR,
        help="most GPUs for a job (default 16)",
    )
    parser.add_argument(
        "--multi-gpu",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="draw GPU counts from the ITP distribution (default: on, as the "
        "artifact, whose -m cannot be turned off)",
    )
    parser.add_argument(
        "--multi-priority",
        action="store_true",
        help="draw (unwritten) priorities, as the artifact's flag does",
    )
    parser.add_argument("--min-ddl", type=float, default=0.5)
    parser.add_argument("--max-ddl", type=float, default=1.5)
    parser.add_argument(
        "--best-effort-percentage",
        type=float,
        default=0.0,
        help="share of best-effort jobs, 0 to 1",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        jobs = generate_elasticflow_jobs(
            args.num_jobs,
            args.lam,
            args.seed,
            gpu_type=args.gpu_type,
            max_scale_factor=args.max_scale_factor,
            min_ddl=args.min_ddl,
            max_ddl=args.max_ddl,
            best_effort_percentage=args.best_effort_percentage,
            multi_gpu=args.multi_gpu,
            multi_priority=args.multi_priority,
        )
    except ValueError as exc:
        parser.error(str(exc))
    write_elasticflow_trace(jobs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
