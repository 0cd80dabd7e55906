"""The live composition root: one service per process (`loom serve`; `loom up` starts several,
loom/up.py).

`serve` wraps one core in a shell on the live bus (`services.runtime.nats_live`) and a wall
clock, registers it as a NATS micro-service (`$SRV.PING|INFO|STATS`, plus a `state` endpoint
on `loomctl.<service>.state` outside the event stream), and runs until SIGTERM or SIGINT, then
drains: its durable consumers stay, so a restarted service resumes where it stopped.

`nodeagent --trainers pytorch` launches real trainer processes on the node's GPUs
(`TrainerNodeCore`); `--trainers simulated` (the default) runs the simulated node
(`SimNodeCore`): jobs progress at their trace speed in time-scaled wall time. `--time-scale S`
makes one wall second S cluster seconds; every process of one cluster gets the same
`--origin` (a Unix time) so they agree on the time.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.micro

from domain.overhead import parse_overhead
from loom.live_args import SERVICES
from loom.simulate import make_scheduler
from schemas.cluster import ClusterSpec, NodeSpec
from schemas.events import GpuInfo, GpuLink, NodeInfo
from schemas.job import JobSpec, JobState
from schemas.tenants import TenantsConfig
from services.injector.core import InjectorCore
from services.metrics.core import MetricsCore
from services.metrics.prometheus import registry_for, serve_http
from services.metrics.stream_usage import StreamWatch
from services.nodeagent.agent import DEFAULT_GRACE_S, TrainerNodeCore, TrainerSettings
from services.nodeagent.gpu import FakeBackend, GpuBackend, detect_backend
from services.nodeagent.jobuser import JobUser
from services.nodeagent.live import NodeAgentShell
from services.nodeagent.simnode import SimNodeCore
from services.placer.binding import PlacerCore
from services.runtime.clock import WallClock
from services.runtime.logging import get_logger
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_live import NatsLiveBus
from services.runtime.service import Core, Shell
from services.runtime.stream_limits import StreamLimits
from services.scheduler.core import SchedulerCore
from services.scheduler.leader import Elector, FencedShell, LeaseStore, Replica, Term
from services.scheduler.liveness import LivenessConfig, RetryPolicy
from services.scheduler.recovery import recover

CONTROL_PLANE = ("scheduler", "placer", "metrics")
VERSION = "0.1.0"
log = get_logger("loom.serve")


def control_subject(service: str) -> str:
    """Request/reply subject of a service's state (outside `loom.>`: never stored)."""
    return f"loomctl.{service}.state"


@dataclass(frozen=True)
class ServeOptions:
    service: str
    nats_url: str
    cluster: ClusterSpec
    policy: str = "fifo"
    round_s: float | None = None
    overhead: str = "none"
    node: str | None = None  # nodeagent: which node of the cluster this agent is
    jobs: Sequence[JobSpec] = ()  # injector: the trace to replay
    time_scale: float = 1.0
    origin: float | None = None
    seed: int = 0
    prometheus_port: int | None = None  # metrics: serve /metrics here
    prometheus_addr: str = "127.0.0.1"
    stream_replicas: int = 1  # copies of the event stream on a NATS cluster
    stream_limits: StreamLimits = field(default_factory=StreamLimits)  # if it creates them
    trainers: str = "simulated"  # nodeagent: "pytorch" (real trainer processes) or "simulated"
    fake_gpus: int | None = None  # nodeagent: K fake GPUs instead of NVML/DCGM discovery
    gpu_backend: str = "auto"  # nodeagent: auto | dcgm | nvml
    checkpoint_root: Path = Path("/var/lib/loom/checkpoints")
    job_user: str | None = None  # nodeagent: run trainers as this unprivileged user
    grace_s: float = DEFAULT_GRACE_S
    fast_forward: int = 0
    advertise_addr: str = "127.0.0.1"  # nodeagent: the address other nodes' trainers use
    auth: NatsAuth = field(default_factory=NatsAuth)  # credentials and TLS files for NATS
    heartbeat_s: float = 5.0  # nodeagent: seconds between heartbeats
    checkpoint_every: int = 0  # nodeagent: trainers checkpoint every N iterations (0: off)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)  # scheduler: lost nodes
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # scheduler: failed trainers
    tenants: TenantsConfig | None = None  # scheduler: quotas and fair share; None: no limits
    replica: str | None = None  # scheduler: this replica's id; elect a leader among replicas
    lease_s: float = 6.0  # scheduler replicas: how long a lease lasts (real seconds)
    renew_s: float = 2.0  # scheduler replicas: how often it is renewed or polled


def build_service(opts: ServeOptions) -> tuple[Core, GpuBackend | None]:
    """The service's core, and for a trainer-launching node agent its GPU backend."""
    if opts.service == "scheduler":
        return make_scheduler(opts.policy, opts.cluster, round_s=opts.round_s,
                              overhead=opts.overhead, seed=opts.seed,
                              liveness=opts.liveness, retry=opts.retry,
                              tenants=opts.tenants), None
    if opts.service == "placer":
        return PlacerCore(opts.cluster), None
    if opts.service == "metrics":
        return MetricsCore(opts.cluster.total_gpus), None
    if opts.service == "injector":
        return InjectorCore(opts.jobs), None
    if opts.service == "nodeagent":
        node = _node(opts)
        if opts.trainers == "simulated":
            return SimNodeCore(node, parse_overhead(opts.overhead), None), None
        if opts.trainers != "pytorch":
            raise ValueError(f"--trainers must be pytorch or simulated, not {opts.trainers!r}")
        return trainer_agent(opts, node)
    raise ValueError(f"unknown service {opts.service!r}; one of {', '.join(SERVICES)}")


def _node(opts: ServeOptions) -> NodeSpec:
    nodes = {n.node_id: n for n in opts.cluster.nodes}
    if opts.node not in nodes:
        raise ValueError(f"nodeagent needs --node, one of the cluster's nodes "
                         f"({', '.join(list(nodes)[:8])}{', …' if len(nodes) > 8 else ''})")
    return nodes[opts.node]


def trainer_agent(opts: ServeOptions, node: NodeSpec) -> tuple[TrainerNodeCore, GpuBackend]:
    """The trainer-launching node agent and the GPU backend it found its GPUs with."""
    backend: GpuBackend = (FakeBackend(opts.fake_gpus, node.gpu_type, node.node_id)
                           if opts.fake_gpus is not None else detect_backend(opts.gpu_backend))
    found = backend.discover()
    inventory = NodeInfo(
        node_id=node.node_id, backend=backend.name,
        gpus=tuple(GpuInfo(index=g.index, uuid=g.uuid, name=g.name,
                           memory_bytes=g.memory_bytes) for g in found),
        links=tuple(GpuLink(a=x.a, b=x.b, kind=x.kind) for x in backend.topology()),
        address=opts.advertise_addr)
    settings = TrainerSettings(python=sys.executable, checkpoint_root=opts.checkpoint_root,
                               grace_s=opts.grace_s, fast_forward=opts.fast_forward,
                               mps_dir=opts.checkpoint_root.parent / "mps",
                               heartbeat_s=opts.heartbeat_s,
                               checkpoint_every=opts.checkpoint_every)
    core = TrainerNodeCore(node, [g.uuid for g in found], settings,
                           addresses={node.node_id: opts.advertise_addr}, inventory=inventory)
    return core, backend


def core_state(core: Core, now: float) -> dict[str, Any]:
    """What `loom status` and operators read from a running service."""
    if isinstance(core, SchedulerCore):
        return {"now": now, "policy": core.policy.name, "cycle": core.cycle,
                "nodes": [n.node_id for n in core.cluster.nodes],
                "drained": sorted(core.drained), "lost": sorted(core.faults.lost),
                "suspended": sorted(core.held),
                "jobs": [job_row(core, jid, now) for jid in core.jobs]}
    if isinstance(core, MetricsCore):
        return {"now": now, "summary": core.summary()}
    return {"now": now, "service": core.name}


def job_row(core: SchedulerCore, job_id: str, now: float) -> dict[str, Any]:
    rec = core.jobs[job_id]
    status = core.status(job_id)
    done = rec.iterations_done
    eta = None
    if rec.state is JobState.RUNNING:
        # The scheduler's own estimate since the last report, as the policies see it.
        elapsed = max(0.0, now - rec.progress_at)
        if rec.iteration_s > 0:
            done = min(rec.spec.iterations,
                       rec.spec.iterations - rec.remaining + elapsed / rec.iteration_s)
            eta = now + (rec.spec.iterations - done) * rec.iteration_s
    return {"job_id": job_id, "state": rec.state.value if rec.state else "rejected",
            "reason": status.reason, "queue_position": status.queue_position,
            "gpus": rec.spec.gpus, "nodes": sorted({n for n, _ in rec.placement}),
            "iterations": rec.spec.iterations,
            "done": round(done, 1), "eta": eta, "tenant": rec.spec.tenant,
            "model": rec.spec.model}


async def serve(opts: ServeOptions, stop: asyncio.Event | None = None) -> int:
    """Run one service until `stop` is set (or SIGTERM/SIGINT); 0 on a clean drain."""
    if opts.service == "scheduler" and opts.replica is not None:
        return await serve_replica(opts, stop)
    core, backend = build_service(opts)
    job_user = JobUser.lookup(opts.job_user) if opts.job_user else None  # before connecting
    clock = WallClock(epoch=0.0 if opts.origin is not None else None, scale=opts.time_scale,
                      origin=opts.origin)
    bus = await NatsLiveBus.connect(opts.nats_url, service=core.name, now=clock.now,
                                    replicas=opts.stream_replicas, auth=opts.auth,
                                    limits=opts.stream_limits)
    # Event ids must not repeat across restarts (JetStream would drop them as duplicates).
    run_id = f"{core.name}.{int(time.time())}.{secrets.token_hex(3)}"
    # A scheduler or simulated node agent that restarts picks up where it died.
    recovered = await recover(core, bus, clock.now())
    shell = (NodeAgentShell(core, bus, clock, run_id=run_id, backend=backend,
                            job_user=job_user)
             if isinstance(core, TrainerNodeCore) and backend is not None
             else Shell(core, bus, clock, run_id=run_id))
    signals: list[signal.Signals] = []
    if stop is None:  # a process of its own: signals stop it
        stop = asyncio.Event()
        signals = on_signals(stop)

    async def state(req: Any) -> None:
        await req.respond(json.dumps(core_state(core, clock.now())).encode())

    def stats(endpoint_stats: Any) -> dict[str, Any]:
        return {"published": bus.stats.published, "delivered": bus.stats.delivered,
                "duplicates": bus.stats.duplicates, "dead_lettered": bus.stats.dead_lettered,
                "errors": shell.errors}

    micro = await nats.micro.add_service(
        bus.nc, name=f"loom-{opts.service}", version=VERSION,
        description=f"Loom {opts.service}", metadata={"core": core.name},
        stats_handler=stats)
    await micro.add_endpoint(name="state", subject=control_subject(core.name), handler=state)
    exporter = watch = None
    if isinstance(core, MetricsCore):  # it also watches how full the streams are
        watch = StreamWatch(bus.js, [bus.stream, bus.deadletters])
        if opts.prometheus_port is not None:
            exporter = serve_http(registry_for(core, opts.cluster, watch.latest),
                                  opts.prometheus_port, opts.prometheus_addr)
    await shell.start()
    if watch is not None:
        watch.start()
    await shell.apply(recovered, None)
    await bus.flush()
    log.info("serving", service=core.name, nats=opts.nats_url)
    try:
        await stop.wait()
    finally:
        log.info("draining", service=core.name)
        if isinstance(shell, NodeAgentShell):
            await shell.stop()  # trainers checkpoint; their last reports go out
        if exporter is not None:
            exporter.shutdown()
        if watch is not None:
            await watch.stop()
        await micro.stop()
        await bus.close()
        drop_signals(signals)
    return 0


async def serve_replica(opts: ServeOptions, stop: asyncio.Event | None = None) -> int:
    """A scheduler replica: stand by until it wins the lease (`services.scheduler.leader`),
    then rebuild the scheduler from the stream and run it for as long as it holds the lease."""
    assert opts.replica is not None
    elector = Elector(opts.replica, lease_s=opts.lease_s, renew_s=opts.renew_s)
    clock = WallClock(epoch=0.0 if opts.origin is not None else None, scale=opts.time_scale,
                      origin=opts.origin)
    control = await NatsLiveBus.connect(opts.nats_url, service=f"scheduler-{opts.replica}",
                                        now=clock.now, replicas=opts.stream_replicas,
                                        auth=opts.auth, limits=opts.stream_limits)
    store = await LeaseStore.open(control.js, replicas=opts.stream_replicas)
    leading: list[SchedulerCore] = []

    async def lead(term: int, valid: Callable[[], bool]) -> Term:
        core, _ = build_service(opts)
        assert isinstance(core, SchedulerCore)
        core.term = term
        bus = await NatsLiveBus.connect(opts.nats_url, service=core.name, now=clock.now,
                                        replicas=opts.stream_replicas, auth=opts.auth,
                                        limits=opts.stream_limits)
        run_id = f"{core.name}.t{term}.{opts.replica}.{secrets.token_hex(3)}"
        shell = FencedShell(core, bus, clock, run_id=run_id, leading=valid)
        try:
            recovered = await recover(core, bus, clock.now())
            await shell.start()
            await shell.apply(recovered, None)
            await bus.flush()
        except BaseException:
            shell.stop_timers()
            await bus.close()
            raise
        leading[:] = [core]

        async def close() -> None:
            leading.clear()
            await bus.close()
        return Term(shell, close)

    async def state(req: Any) -> None:
        if leading:  # a standby stays silent: the leader answers
            await req.respond(json.dumps(core_state(leading[0], clock.now())).encode())

    micro = await nats.micro.add_service(
        control.nc, name="loom-scheduler", version=VERSION, description="Loom scheduler replica",
        metadata={"core": "scheduler", "replica": opts.replica})
    await micro.add_endpoint(name="state", subject=control_subject("scheduler"), handler=state)
    signals: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        signals = on_signals(stop)
    log.info("replica standing by", replica=opts.replica, nats=opts.nats_url)
    try:
        await Replica(elector, store, lead).run(stop)
    finally:
        await micro.stop()
        await control.close()
        drop_signals(signals)
    return 0


def on_signals(stop: asyncio.Event) -> list[signal.Signals]:
    """SIGTERM and SIGINT set `stop` (a process running one service, or `loom up`)."""
    loop = asyncio.get_running_loop()
    sigs = [signal.SIGTERM, signal.SIGINT]
    for sig in sigs:
        loop.add_signal_handler(sig, stop.set)
    return sigs


def drop_signals(sigs: list[signal.Signals]) -> None:
    loop = asyncio.get_running_loop()
    for sig in sigs:
        loop.remove_signal_handler(sig)


async def ping(nc: Any, wait_s: float = 0.3) -> list[str]:
    """Names of the Loom services answering `$SRV.PING` within `wait_s` (core names)."""
    inbox = nc.new_inbox()
    found: list[str] = []

    async def collect(msg: Any) -> None:
        try:
            info = json.loads(msg.data)
        except ValueError:
            return  # a "no responders" status, or not a micro-service
        if isinstance(info, dict) and info.get("name", "").startswith("loom-"):
            found.append(info.get("metadata", {}).get("core", info["name"]))

    sub = await nc.subscribe(inbox, cb=collect)
    await nc.publish("$SRV.PING", b"", reply=inbox)
    await asyncio.sleep(wait_s)
    await sub.unsubscribe()
    return sorted(found)
