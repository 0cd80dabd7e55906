"""Run a trace through the real services on a virtual-time bus (memory or NATS JetStream).

This is the composition root: it builds the cores, wraps each in a shell, connects them to one
bus and lets the kernel run until every job has left the system.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from domain.overhead import OverheadModel
from loom.eventlog import EventLogWriter, RunInfo
from loom.versions import running_versions
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from schemas.tenants import TenantsConfig
from schemas.throughputs import ThroughputTable
from services.injector.core import InjectorCore
from services.metrics.core import MetricsCore
from services.metrics.outcomes import JobOutcome
from services.nodeagent.simfleet import SimFleetCore
from services.placer.core import PlacerCore
from services.runtime.bus import Bus, MemoryBus
from services.runtime.clock import VirtualClock
from services.runtime.kernel import SimKernel
from services.runtime.recorder import RecordingBus
from services.runtime.service import Core, Shell
from services.scheduler.build import build_scheduler

BusKind = Literal["memory", "nats"]


@dataclass(frozen=True)
class SimConfig:
    policy: str
    # A sequence is sorted by submission time; any other iterable is streamed, in that order.
    jobs: Iterable[JobSpec]
    cluster: ClusterSpec
    trace_name: str = "trace"
    overhead: str = "none"
    round_s: float | None = None  # None: the policy's own re-planning (event-driven)
    placement: str | None = None  # None: the policy's own scheme
    bus: BusKind = "memory"
    nats_url: str | None = None
    seed: int = 0
    profile: ThroughputTable | None = None  # per-type and co-located throughputs, if known
    free_at_once: bool = False  # rounds: re-plan when a job finishes (see SchedulerConfig)
    # Stop once these jobs have all finished (Gavel's jobs_to_complete); None: run everything.
    stop_after: frozenset[str] | None = None
    log: Path | None = None  # write the run's event log here (see loom.eventlog)
    tenants: TenantsConfig | None = None  # quotas and fair share; None: no limits
    job_count: int | None = None  # how many `jobs` stream in, where known (for progress)
    # Forecast waiting jobs' starts at most every S seconds and score them (summary's
    # `forecast_error_s`); None: no forecasts (they never change a decision or the digest).
    forecast_every_s: float | None = None

    @property
    def total_jobs(self) -> int:
        """How many jobs the run is given (0 for a stream of unknown length)."""
        return len(self.jobs) if isinstance(self.jobs, Sized) else self.job_count or 0


@dataclass(repr=False)
class SimResult:
    summary: dict[str, object]
    jobs: list[JobOutcome] = field(default_factory=list)
    # (time, fraction of the cluster's GPUs busy), a bounded series for utilisation plots
    utilisation: list[tuple[float, float]] = field(default_factory=list)

    def __repr__(self) -> str:
        # Short: Python 3.11's asyncio.run formats the finished task, result and all, when it
        # restores the SIGINT handler (signal.getsignal): 1.3 s of CPU at 92k jobs.
        return (f"SimResult(jobs={len(self.jobs)}, "
                f"decision_digest={self.summary.get('decision_digest')!r})")


ProgressFn = Callable[[int, int, float], None]  # finished, total, virtual time


# finished, total, virtual time, events published and jobs arrived so far: what a progress
# display needs for a rate and an ETA.
EventsProgressFn = Callable[[int, int, float, int, int], None]


async def run_simulation(cfg: SimConfig, progress: ProgressFn | None = None, *,
                         on_progress: EventsProgressFn | None = None) -> SimResult:
    t0 = time.perf_counter()
    scheduler = build_scheduler(cfg.policy, cfg.cluster, round_s=cfg.round_s,
                                overhead=cfg.overhead, placement=cfg.placement, seed=cfg.seed,
                                profile=cfg.profile, free_at_once=cfg.free_at_once,
                                tenants=cfg.tenants, replays_failures=True,
                                forecast_every_s=cfg.forecast_every_s)
    overhead, replan = scheduler.config.overhead, scheduler.config.replan

    kernel = SimKernel()
    clock = VirtualClock(kernel)
    writer = None if cfg.log is None else EventLogWriter(cfg.log, "sim", run_info(cfg))
    bus = await _make_bus(cfg, kernel)
    if writer is not None:
        bus = RecordingBus(bus, writer, clock.now)
    metrics = MetricsCore(cfg.cluster.total_gpus, overhead)
    cores: list[Core] = [metrics, scheduler, PlacerCore(cfg.cluster)]
    cores += simulated_nodes(cfg.cluster, overhead, cfg.profile)
    injector = InjectorCore(cfg.jobs)
    cores.append(injector)  # last: everything it feeds is subscribed by then
    shells = [Shell(core, bus, clock, run_id=f"sim{cfg.seed}") for core in cores]
    ran = False
    try:
        for shell in shells:
            await shell.start()
        total = cfg.total_jobs

        def tick() -> None:
            done = metrics.finished + metrics.failed + metrics.rejected  # jobs that have left
            if progress is not None:
                progress(done, total, kernel.now)
            if on_progress is not None:
                on_progress(done, total, kernel.now, bus.stats.published, len(metrics.jobs))

        stop = None
        if cfg.stop_after is not None:
            metrics.awaited = set(cfg.stop_after)

            def stop() -> bool:
                return not metrics.awaited

        with _collector_tuned():
            await kernel.run(progress=tick if progress or on_progress else None, stop=stop)
        tick()
        if injector.error is not None:  # what arrived ran; the rest of the trace is unread
            raise ValueError(injector.error)
        ran = True
    finally:
        await bus.close()
        if writer is not None:
            writer.close(metrics.digest, complete=ran)

    wall = time.perf_counter() - t0
    solver = scheduler.policy.solver_stats()
    summary: dict[str, object] = {
        "policy": cfg.policy,
        "trace": cfg.trace_name,
        "cluster": cfg.cluster.name,
        "bus": cfg.bus,
        "replan": replan,
        "round_s": cfg.round_s,
        "overhead": overhead.name,
        "placement": cfg.placement or scheduler.policy.placement,
        "seed": cfg.seed,
    }
    summary.update(metrics.summary())
    summary.update({
        "events": bus.stats.published,
        "cycles": scheduler.cycle,
        "unfinished": scheduler.active,
        "stopped_early": cfg.stop_after is not None and kernel.pending > 0,
        "errors": sum(s.errors for s in shells) + bus.stats.dead_lettered,
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        # What the policy's solver did (solves, seconds, answers it fell back from); absent for
        # a policy that solves nothing.
        **({} if solver is None else {"solver": dict(solver)}),
        # What made the decisions besides Loom: a newer solver may break ties otherwise.
        "versions": running_versions(),
    })
    return SimResult(summary=summary, jobs=list(metrics.jobs.values()),
                     utilisation=metrics.utilisation_over_time(kernel.now))


def simulated_nodes(cluster: ClusterSpec, overhead: OverheadModel,
                    profile: ThroughputTable | None) -> list[Core]:
    """The cluster's nodes as one fleet service: a cycle is taken once for all of them, not
    once per node (see `services.nodeagent.simfleet`)."""
    return [SimFleetCore(cluster.nodes, overhead, profile)]


@contextlib.contextmanager
def _collector_tuned() -> Iterator[None]:
    """Python's cyclic collector, set for a run: what exists when it starts (trace, cores,
    modules) is frozen out of collections, and the young generation is collected once
    5,000,000 more objects are tracked than freed, rather than 700. A run makes millions of
    short-lived objects that reference counting frees, and almost no cycles, so collecting
    rarely keeps nothing longer. A collection walks what the heap grew by since the last
    (mostly records of jobs that arrived), each older generation's walks it again, and a
    larger threshold makes those rarer (measured: docs/validation.md, issue 20). Only the
    young generations are collected before the freeze: a full collection walks every module
    (cvxpy's and scipy's included), and old garbage frozen now is freed after the run. Nor is
    one collected after it: the young generation, up to 5,000,000 objects the run made, would
    be walked at the next allocation; frozen and thawed, it joins the oldest one unwalked."""
    threshold = gc.get_threshold()
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(5_000_000, *threshold[1:])
    try:
        yield
    finally:
        gc.freeze()
        gc.set_threshold(*threshold)
        gc.unfreeze()


def run_info(cfg: SimConfig) -> RunInfo:
    """What an event log's header keeps of this run, for `loom replay`."""
    profile = None
    if cfg.profile is not None:
        root = Path(__file__).resolve().parents[1]
        path = cfg.profile.path.resolve()
        profile = str(path.relative_to(root) if path.is_relative_to(root) else path)
    return RunInfo(policy=cfg.policy, cluster=cfg.cluster.model_dump(mode="json"),
                   seed=cfg.seed, overhead=cfg.overhead, round_s=cfg.round_s,
                   placement=cfg.placement, free_at_once=cfg.free_at_once,
                   throughputs=profile, trace=cfg.trace_name, run_id=f"sim{cfg.seed}",
                   tenants=None if cfg.tenants is None else cfg.tenants.model_dump(mode="json"))


async def _make_bus(cfg: SimConfig, kernel: SimKernel) -> Bus:
    if cfg.bus == "memory":
        return MemoryBus(kernel)
    if cfg.bus == "nats":
        from services.runtime.nats_bus import NatsSimBus

        return await NatsSimBus.open(kernel, cfg.nats_url, run_id=f"{cfg.policy}-{cfg.seed}")
    raise ValueError(f"unknown bus {cfg.bus!r}; use memory or nats")
