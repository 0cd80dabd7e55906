"""Running simulations from the CLI: one in-process, or several in parallel processes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

import policies
from loom.simulate import BusKind, EventsProgressFn, SimConfig, SimResult, run_simulation
from schemas.job import JobSpec
from schemas.tenants import load_tenants
from services.runtime.logging import configure
from traces import load_cluster, load_trace
from traces.loader import Trace
from traces.measured import load_measured, with_measured
from traces.scaling import load_scaling, with_scaling
from traces.throughputs import load_throughputs


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs, as plain values (it crosses process boundaries)."""

    trace: str
    cluster: str
    policy: str
    bus: BusKind = "memory"
    nats_url: str | None = None
    round_s: float | None = None
    free_at_once: bool = False
    overhead: str | None = None
    placement: str | None = None
    seed: int = 0
    log_level: str = "warning"
    gpus_per_server: str = "4"  # for type-count clusters such as 36:36:36
    throughputs: str | None = None  # profile JSON; None: Gavel's bundled simulation table
    stop_after: tuple[str, ...] | None = None  # stop once these job ids have all finished
    gpu_type: str | None = None  # A100 | T4: make deadline-trace jobs elastic from its table
    tenants: str | None = None  # tenants file (quotas, fair share); None: no limits
    measured: str | None = None  # a `loom profile` folder: measured speeds (and overheads)
    forecast_every_s: float | None = None  # start forecasts at most every S s (None: none)

    def validate(self) -> None:
        """Fail before any work starts: unknown policy, unreadable trace or cluster."""
        if self.policy not in policies.REGISTRY:
            raise policies.UnknownPolicy(self.policy)
        load_cluster(self.cluster, self.gpus_per_server)
        self._trace()
        if self.gpu_type is not None:
            load_scaling(self.gpu_type)
        if self.tenants is not None:
            load_tenants(self.tenants)
        if self.measured is not None:
            load_measured(self.measured)

    def _trace(self) -> Trace:
        table = load_throughputs(self.throughputs) if self.throughputs else None
        return load_trace(self.trace, throughputs=table)

    def config(self) -> SimConfig:
        trace = self._trace()
        jobs: Iterable[JobSpec] = trace.source  # a production trace streams from its file
        if self.gpu_type is not None:
            jobs = with_scaling(jobs, load_scaling(self.gpu_type))
        overhead = self.overhead or trace.default_overhead
        if self.measured is not None:
            jobs = with_measured(jobs, load_measured(self.measured))
            measured_overheads = Path(self.measured) / "overheads.json"
            if self.overhead is None and measured_overheads.exists():
                overhead = f"profile:{measured_overheads}"
        return SimConfig(
            policy=self.policy,
            jobs=jobs,
            job_count=trace.job_count,
            cluster=load_cluster(self.cluster, self.gpus_per_server),
            trace_name=trace.name,
            overhead=overhead,
            round_s=self.round_s,
            free_at_once=self.free_at_once,
            placement=self.placement,
            bus=self.bus,
            nats_url=self.nats_url,
            seed=self.seed,
            profile=trace.profile,
            stop_after=None if self.stop_after is None else frozenset(self.stop_after),
            tenants=None if self.tenants is None else load_tenants(self.tenants),
            forecast_every_s=self.forecast_every_s,
        )


def _progress_bar(disable: bool = False) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True, disable=disable,
    )


def _note(now: float) -> str:
    return f"jobs · t={now:,.0f}s"


def run_one(spec: RunSpec, progress: bool = False, *, cfg: SimConfig | None = None,
            on_progress: EventsProgressFn | None = None) -> SimResult:
    """Run `spec` here (`cfg`: its config, when already built); `on_progress` reports as it
    goes, else `progress` shows a bar."""
    cfg = spec.config() if cfg is None else cfg
    if on_progress is not None:
        return asyncio.run(run_simulation(cfg, on_progress=on_progress))
    if not progress:
        return asyncio.run(run_simulation(cfg))
    with _progress_bar() as bar:
        task = bar.add_task(spec.policy, total=cfg.total_jobs, note=_note(0.0))

        def update(done: int, total: int, now: float) -> None:
            bar.update(task, completed=done, note=_note(now))

        return asyncio.run(run_simulation(cfg, update))


def _worker(spec: RunSpec, updates: Any, key: int) -> SimResult:
    configure(spec.log_level)

    def update(done: int, total: int, now: float) -> None:
        updates.put((key, done, total, now))

    return asyncio.run(run_simulation(spec.config(), update))


def compare(specs: list[RunSpec], processes: int = 0, quiet: bool = False) -> list[SimResult]:
    """Run each spec in its own process (they share nothing), showing one bar per policy
    (none when `quiet`)."""
    return run_parallel(specs, [s.policy for s in specs], processes, quiet=quiet)


def run_parallel(
    specs: Sequence[RunSpec], labels: Sequence[str], processes: int = 0,
    order: Sequence[int] | None = None, quiet: bool = False,
) -> list[SimResult]:
    """Run every spec in a pool of processes; results come back in the order of `specs`.

    `order` is the submission order (indexes into `specs`). When there are more runs than
    workers, a bar counts finished runs and each run's bar shows only while it runs, so a
    long sweep keeps a screenful of bars.
    """
    workers = processes or min(len(specs), os.cpu_count() or 1)
    many = len(specs) > workers
    # Off a terminal (a CI log, a file) bars show nothing: a line every LINE_INTERVAL_S instead.
    lines = not quiet and not sys.stderr.isatty()
    latest: dict[int, tuple[int, int]] = {}  # run → (jobs finished, jobs in all)
    last_line = time.monotonic()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, _progress_bar(disable=quiet or lines) as bar:
        updates = manager.Queue()
        overall = bar.add_task("runs", total=len(specs), note="done") if many else None
        tasks: dict[int, TaskID] = {}
        if not many:
            tasks = {i: bar.add_task(label, total=None, note=_note(0.0))
                     for i, label in enumerate(labels)}
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {i: pool.submit(_worker, specs[i], updates, i)
                       for i in (order if order is not None else range(len(specs)))}
            while not all(f.done() for f in futures.values()):
                try:
                    key, done, total, now = updates.get(timeout=0.2)
                except queue.Empty:
                    pass
                else:
                    latest[key] = (done, total)
                    if key not in tasks and not (many and futures[key].done()):
                        tasks[key] = bar.add_task(labels[key], total=None, note="")
                    if key in tasks:
                        bar.update(tasks[key], completed=done, total=total, note=_note(now))
                if overall is not None:
                    _retire_finished(bar, overall, tasks, futures)
                if lines and time.monotonic() - last_line >= LINE_INTERVAL_S:
                    last_line = time.monotonic()
                    print(_progress_line(labels, futures, latest), file=sys.stderr, flush=True)
            return [futures[i].result() for i in range(len(specs))]


LINE_INTERVAL_S = 9.5  # off a terminal, a progress line this often


def _progress_line(labels: Sequence[str], futures: dict[int, Future[SimResult]],
                   latest: dict[int, tuple[int, int]]) -> str:
    """`runs: 2/6 done · srtf 1,200/5,755 jobs · fifo 800/5,755 jobs` (the runs going on)."""
    going = [f"{labels[k]} {done:,}/{total:,} jobs" for k, (done, total) in sorted(latest.items())
             if not futures[k].done()]
    finished = sum(f.done() for f in futures.values())
    return " · ".join([f"runs: {finished}/{len(futures)} done", *going])


def _retire_finished(
    bar: Progress, overall: TaskID, tasks: dict[int, TaskID], futures: dict[int, Future[SimResult]]
) -> None:
    for key, task in list(tasks.items()):
        if futures[key].done():
            bar.remove_task(task)
            del tasks[key]
    bar.update(overall, completed=sum(f.done() for f in futures.values()))
