"""Running simulations from the CLI: one in-process, or several in parallel processes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import policies
from loom.simulate import BusKind, SimConfig, SimResult, run_simulation
from services.runtime.logging import configure
from traces import load_cluster, load_trace
from traces.loader import Trace
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
    overhead: str | None = None
    placement: str | None = None
    seed: int = 0
    log_level: str = "warning"
    gpus_per_server: str = "4"  # for type-count clusters such as 36:36:36
    throughputs: str | None = None  # profile JSON; None: Gavel's bundled simulation table

    def validate(self) -> None:
        """Fail before any work starts: unknown policy, unreadable trace or cluster."""
        if self.policy not in policies.REGISTRY:
            raise policies.UnknownPolicy(self.policy)
        load_cluster(self.cluster, self.gpus_per_server)
        self._trace()

    def _trace(self) -> Trace:
        table = load_throughputs(self.throughputs) if self.throughputs else None
        return load_trace(self.trace, throughputs=table)

    def config(self) -> SimConfig:
        trace = self._trace()
        return SimConfig(
            policy=self.policy,
            jobs=trace.jobs,
            cluster=load_cluster(self.cluster, self.gpus_per_server),
            trace_name=trace.name,
            overhead=self.overhead or trace.default_overhead,
            round_s=self.round_s,
            placement=self.placement,
            bus=self.bus,
            nats_url=self.nats_url,
            seed=self.seed,
        )


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("jobs · t={task.fields[t]:,.0f}s"), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )


def run_one(spec: RunSpec, progress: bool = False) -> SimResult:
    cfg = spec.config()
    if not progress:
        return asyncio.run(run_simulation(cfg))
    with _progress_bar() as bar:
        task = bar.add_task(spec.policy, total=len(cfg.jobs), t=0.0)

        def update(done: int, total: int, now: float) -> None:
            bar.update(task, completed=done, t=now)

        return asyncio.run(run_simulation(cfg, update))


def _worker(spec: RunSpec, updates: Any) -> SimResult:
    configure(spec.log_level)

    def update(done: int, total: int, now: float) -> None:
        updates.put((spec.policy, done, total, now))

    return asyncio.run(run_simulation(spec.config(), update))


def compare(specs: list[RunSpec], processes: int = 0) -> list[SimResult]:
    """Run each spec in its own process (they share nothing), showing one bar per policy."""
    workers = processes or min(len(specs), os.cpu_count() or 1)
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, _progress_bar() as bar:
        updates = manager.Queue()
        tasks = {s.policy: bar.add_task(s.policy, total=None, t=0.0) for s in specs}
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_worker, s, updates) for s in specs]
            while not all(f.done() for f in futures):
                try:
                    policy, done, total, now = updates.get(timeout=0.2)
                except queue.Empty:
                    continue
                bar.update(tasks[policy], completed=done, total=total, t=now)
            return [f.result() for f in futures]
