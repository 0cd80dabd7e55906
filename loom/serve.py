"""The live composition root: one service per process (`loom serve`; `loom up` starts several,
loom/up.py).

`serve` wraps one core in a shell on the live bus (`services.runtime.nats_live`) and a wall
clock, registers it as a NATS micro-service (`$SRV.PING|INFO|STATS`, plus a `state` endpoint
on `loomctl.<service>.state` outside the event stream, and those its builder adds: the
scheduler's `queues`, for `loom queues`, on `loomctl.scheduler.queues`), and runs until
SIGTERM or SIGINT, then drains: its durable consumers stay, so a restarted service resumes
where it stopped.

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
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats.micro

from loom.builders import Built, ServeOptions, build_service, queues_reply, scheduler_for
from loom.versions import NOT_INSTALLED, running_versions
from schemas.subjects import QUEUES_REQUEST
from services.metrics.prometheus import registry_for, serve_http
from services.metrics.stream_usage import StreamWatch
from services.nodeagent.jobuser import JobUser
from services.nodeagent.live import NodeAgentShell
from services.runtime.clock import WallClock
from services.runtime.history import recover
from services.runtime.logging import get_logger
from services.runtime.nats_live import NatsLiveBus
from services.runtime.service import Shell
from services.scheduler.core import SchedulerCore
from services.scheduler.leader import Elector, FencedShell, LeaseStore, Replica, Term

__all__ = ["Built", "ServeOptions", "build_service", "serve", "serve_replica"]

CONTROL_PLANE = ("scheduler", "placer", "metrics")


def service_version(installed: str) -> str:
    """The version a NATS service registers with: it must be semantic, and a checkout run
    from PYTHONPATH (a GPU node's copy, say) has no installed one."""
    return "0.0.0" if installed == NOT_INSTALLED else installed


VERSION = service_version(running_versions()["loom"])  # the installed package's (pyproject)
log = get_logger("loom.serve")


def control_subject(service: str) -> str:
    """Request/reply subject of a service's state (outside `loom.>`: never stored)."""
    return f"loomctl.{service}.state"


async def serve(opts: ServeOptions, stop: asyncio.Event | None = None) -> int:
    """Run one service until `stop` is set (or SIGTERM/SIGINT); 0 on a clean drain."""
    if opts.service == "scheduler" and opts.replica is not None:
        return await serve_replica(opts, stop)
    built = build_service(opts)
    core = built.core
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
    agent = (NodeAgentShell(built.agent, bus, clock, run_id=run_id, backend=built.backend,
                            job_user=job_user, health_checks=opts.health_checks)
             if built.agent is not None and built.backend is not None else None)
    shell = agent or Shell(core, bus, clock, run_id=run_id)
    signals: list[signal.Signals] = []
    if stop is None:  # a process of its own: signals stop it
        stop = asyncio.Event()
        signals = on_signals(stop)

    async def state(req: Any) -> None:
        await req.respond(json.dumps(core.state(clock.now())).encode())

    def stats(endpoint_stats: Any) -> dict[str, Any]:
        return {"published": bus.stats.published, "delivered": bus.stats.delivered,
                "duplicates": bus.stats.duplicates, "dead_lettered": bus.stats.dead_lettered,
                "errors": shell.errors}

    micro = await nats.micro.add_service(
        bus.nc, name=f"loom-{opts.service}", version=VERSION,
        description=f"Loom {opts.service}", metadata={"core": core.name},
        stats_handler=stats)
    await micro.add_endpoint(name="state", subject=control_subject(core.name), handler=state)
    for name, (subject, answer) in built.endpoints.items():
        await micro.add_endpoint(name=name, subject=subject, handler=responder(answer, clock))
    exporter = watch = None
    if built.metrics is not None:  # it also watches how full the streams are
        watch = StreamWatch(bus.js, [bus.stream, bus.deadletters])
        if opts.prometheus_port is not None:
            exporter = serve_http(registry_for(built.metrics, opts.cluster, watch.latest),
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
        if agent is not None:
            await agent.stop()  # trainers checkpoint; their last reports go out
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
        core = scheduler_for(opts)
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
            await req.respond(json.dumps(leading[0].state(clock.now())).encode())

    async def queues(req: Any) -> None:
        if leading:
            await req.respond(queues_reply(leading[0], clock.now()))

    micro = await nats.micro.add_service(
        control.nc, name="loom-scheduler", version=VERSION, description="Loom scheduler replica",
        metadata={"core": "scheduler", "replica": opts.replica})
    await micro.add_endpoint(name="state", subject=control_subject("scheduler"), handler=state)
    await micro.add_endpoint(name="queues", subject=QUEUES_REQUEST, handler=queues)
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


def responder(answer: Callable[[float], bytes], clock: WallClock
              ) -> Callable[[Any], Awaitable[None]]:
    """A micro-service handler answering each request with `answer(now)`."""
    async def respond(req: Any) -> None:
        await req.respond(answer(clock.now()))

    return respond


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
