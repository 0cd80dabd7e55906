"""`loom sweep`: average JCT against load, measured the way Gavel measures its steady state.

Gavel's `scripts/sweeps/run_sweep_continuous.py` runs each policy at a range of input job rates
(jobs per hour; Poisson arrivals with a mean gap of λ = 3600 / rate seconds) and seeds, and
reports the average JCT of the jobs whose IDs fall in a window (`-s 4000 -e 5000`): the jobs
before the window bring the cluster to its steady state, and those after it keep the load on
while the window's jobs finish. Gavel numbers jobs in arrival order from 0; so do its trace
reader and `traces.gavel_generator`, which draws every (rate, seed) trace here.

Each trace goes through Gavel's 10-field file and `load_trace`, as `--save-traces` keeps it,
so a saved file replays a run exactly (in `loom sim` or Gavel's trace simulator).
"""

from __future__ import annotations

import csv
import json
import shlex
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean

import policies
from loom.runs import RunSpec, run_parallel
from loom.simulate import SimResult
from services.metrics.outcomes import JobOutcome
from traces import load_cluster, load_throughputs
from traces.gavel_generator import Distribution, generate_gavel_jobs, write_gavel_trace

CSV_COLUMNS = (
    "policy", "rate_jobs_per_h", "seed", "jobs", "window", "avg_jct_window_s", "avg_jct_all_s",
    "makespan_s", "utilization", "wall_s",
)


def default_window(jobs: int) -> tuple[int, int]:
    """The middle third of the job IDs, [jobs // 3, 2 * jobs // 3).

    Gavel's `-s 4000 -e 5000` assumes a simulator that keeps generating jobs until the window
    is done; a finite trace needs jobs on both sides: a third to fill the cluster, a third to
    keep it loaded while the window drains.
    """
    start = jobs // 3
    return start, max(start + 1, 2 * jobs // 3)


@dataclass(frozen=True)
class Sweep:
    """Every run's inputs: policies × rates (jobs per hour) × seeds, on one cluster."""

    policies: tuple[str, ...]
    rates: tuple[float, ...]
    seeds: tuple[int, ...]
    cluster: str
    jobs: int = 1000
    window: tuple[int, int] | None = None  # job IDs [start, end); None: default_window(jobs)
    gpus_per_server: str = "4"
    throughputs: str | None = None  # profile JSON; None: Gavel's simulation table
    distribution: Distribution = "philly"  # what Gavel's continuous sweep generates
    multi_gpu: bool = False
    multi_priority: bool = False
    round_s: float | None = None  # None: the policy's own (Gavel's policies: 360 s rounds)
    log_level: str = "warning"
    # Gavel stops a run once every window job has finished; True runs every job to the end
    # (whole-trace JCT and makespan then cover all jobs).
    run_to_completion: bool = False

    @property
    def job_window(self) -> tuple[int, int]:
        return self.window if self.window is not None else default_window(self.jobs)

    def validate(self) -> None:
        """Fail before any trace is drawn; messages name the option at fault."""
        for name in self.policies:
            if name not in policies.REGISTRY:
                raise ValueError(f"--policies: {policies.UnknownPolicy(name)}")
        if self.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {self.jobs}")
        start, end = self.job_window
        if not 0 <= start < end <= self.jobs:
            raise ValueError(
                f"--window {start}:{end} is outside the job IDs 0..{self.jobs - 1} "
                f"(--jobs {self.jobs}); need 0 <= START < END <= {self.jobs}"
            )
        load_cluster(self.cluster, self.gpus_per_server)


@dataclass(frozen=True)
class SweepRow:
    """One run's measurements; `CSV_COLUMNS` are written to sweep.csv, all of it to JSON."""

    policy: str
    rate_jobs_per_h: float
    seed: int
    jobs: int
    window: str  # "start:end", job IDs, end excluded
    avg_jct_window_s: float | None  # None unless every job of the window finished
    avg_jct_all_s: float | None
    makespan_s: float | None
    utilization: float
    wall_s: float
    window_unfinished: int = 0
    errors: int = 0


def trace_file(rate: float, seed: int) -> str:
    return f"rate{rate:g}-seed{seed}.trace"


def write_traces(sweep: Sweep, directory: Path) -> dict[tuple[float, int], Path]:
    """Draw one trace per (rate, seed), shared by every policy, in Gavel's format."""
    table = load_throughputs(sweep.throughputs) if sweep.throughputs else None
    drawn = {}
    for rate in sweep.rates:
        for seed in sweep.seeds:
            try:
                drawn[rate, seed] = generate_gavel_jobs(
                    sweep.jobs, 3600.0 / rate, seed, multi_gpu=sweep.multi_gpu,
                    multi_priority=sweep.multi_priority, distribution=sweep.distribution,
                    throughputs=table,
                )
            except KeyError as exc:  # a job type the profile lacks
                raise ValueError(f"--throughputs: {exc.args[0]}") from None
    directory.mkdir(parents=True, exist_ok=True)  # only once every trace could be drawn
    return {key: write_gavel_trace(jobs, directory / trace_file(*key))
            for key, jobs in drawn.items()}


def window_jct(jobs: Iterable[JobOutcome], window: tuple[int, int]) -> tuple[float | None, int]:
    """(mean JCT of the jobs with IDs in [start, end), how many of them did not finish).

    The mean is None if any did not finish: averaging only the survivors would flatter the
    policy that starves jobs (Gavel's run waits for the whole window).
    """
    start, end = window
    inside = [j for j in jobs if start <= int(j.job_id) < end]
    jcts = [j.jct_s for j in inside if j.jct_s is not None]
    unfinished = end - start - len(jcts)
    return (fmean(jcts) if jcts and not unfinished else None), unfinished


def _row(sweep: Sweep, policy: str, rate: float, seed: int, result: SimResult) -> SweepRow:
    s = result.summary
    window = sweep.job_window
    jct, unfinished = window_jct(result.jobs, window)
    return SweepRow(
        policy=policy, rate_jobs_per_h=rate, seed=seed, jobs=len(result.jobs),
        window=f"{window[0]}:{window[1]}", avg_jct_window_s=jct,
        avg_jct_all_s=_number(s, "avg_jct_s"), makespan_s=_number(s, "makespan_s"),
        utilization=_number(s, "gpu_util") or 0.0, wall_s=_number(s, "wall_s") or 0.0,
        window_unfinished=unfinished, errors=int(_number(s, "errors") or 0),
    )


def _number(summary: Mapping[str, object], key: str) -> float | None:
    value = summary.get(key)
    return float(value) if isinstance(value, int | float) else None


def run_sweep(sweep: Sweep, processes: int = 0, save_traces: Path | None = None) -> list[SweepRow]:
    """Run every (policy, rate, seed) in parallel processes; rows ordered policy, rate, seed
    (policies as given, rates and seeds as given)."""
    with tempfile.TemporaryDirectory(prefix="loom-sweep-") as tmp:
        traces = write_traces(sweep, save_traces or Path(tmp))
        points = [(p, r, s) for p in sweep.policies for r in sweep.rates for s in sweep.seeds]
        window_ids = tuple(str(i) for i in range(*sweep.job_window))
        specs = [
            RunSpec(trace=str(traces[r, s]), cluster=sweep.cluster, policy=p,
                    round_s=sweep.round_s, seed=s, log_level=sweep.log_level,
                    gpus_per_server=sweep.gpus_per_server, throughputs=sweep.throughputs,
                    stop_after=None if sweep.run_to_completion else window_ids)
            for p, r, s in points
        ]
        labels = [f"{p} {r:g}/h seed {s}" for p, r, s in points]
        # Highest rates first: their queues make them the slowest runs, and starting the
        # longest runs first keeps every process busy until the end.
        order = sorted(range(len(points)), key=lambda i: -points[i][1])
        results = run_parallel(specs, labels, processes, order=order)
    return [_row(sweep, *point, result) for point, result in zip(points, results, strict=True)]


def curves(rows: Iterable[SweepRow]) -> dict[str, dict[float, list[float | None]]]:
    """policy → rate → window JCT (s) of each seed, in row order."""
    out: dict[str, dict[float, list[float | None]]] = {}
    for r in rows:
        out.setdefault(r.policy, {}).setdefault(r.rate_jobs_per_h, []).append(r.avg_jct_window_s)
    return out


def _num(x: float | None) -> str:
    return "" if x is None else repr(round(x, 6))


def write_csv(rows: Sequence[SweepRow], path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([
                r.policy, repr(r.rate_jobs_per_h), r.seed, r.jobs, r.window,
                _num(r.avg_jct_window_s), _num(r.avg_jct_all_s), _num(r.makespan_s),
                _num(r.utilization), _num(r.wall_s),
            ])
    return path


def write_json(
    rows: Sequence[SweepRow], sweep: Sweep, argv: Sequence[str], path: Path
) -> Path:
    settings: dict[str, object] = asdict(sweep)
    settings["window"] = list(sweep.job_window)
    doc: Mapping[str, object] = {
        "command": shlex.join(["loom", *argv]),
        "sweep": settings,
        "runs": [asdict(r) for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
