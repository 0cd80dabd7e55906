"""Helpers for the integration tests: seeded traces, the service pipeline, stream readers."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import nats

import policies
from domain.overhead import parse_overhead
from schemas.cluster import ClusterSpec
from schemas.events import Envelope
from schemas.job import JobSpec
from services.metrics.core import MetricsCore
from services.nodeagent.simfleet import SimNodeCore
from services.placer.core import PlacerCore
from services.runtime.bus import Bus, BusStats, Decoder, Handler, Wants, decode_any
from services.runtime.clock import VirtualClock
from services.runtime.kernel import SimKernel
from services.runtime.nats_bus import NatsSimBus
from services.runtime.service import Core, Shell
from services.scheduler.core import SchedulerConfig, SchedulerCore
from tests.builders import make_job


def generated_trace(seed: int, n: int = 30) -> list[JobSpec]:
    """Mixed GPU counts and lengths, bursts of simultaneous arrivals: enough to preempt."""
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.choice([0.0, 0.0, 5.0, 30.0, 120.0, 600.0])
        jobs.append(
            make_job(f"g{seed}-{i:02d}")
            .gpus(rng.choice([1, 1, 2, 4, 8]))
            .runs_for(rng.choice([50, 300, 2000, 8000]))
            .submit(t)
            .build()
        )
    return jobs


@dataclass
class Pipeline:
    """The services of `loom.simulate.run_simulation`, minus the injector."""

    kernel: SimKernel
    bus: Bus
    metrics: MetricsCore
    scheduler: SchedulerCore
    shells: list[Shell] = field(default_factory=list)

    async def start(self) -> None:
        for shell in self.shells:
            await shell.start()

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self.shells)


def build_pipeline(
    kernel: SimKernel, bus: Bus, cl: ClusterSpec, policy: str = "fifo",
    extra: Sequence[Core] = (),
) -> Pipeline:
    overhead = parse_overhead("none")
    pol = policies.make(policy)
    metrics = MetricsCore(cl.total_gpus)
    scheduler = SchedulerCore(cl, pol, SchedulerConfig(replan=pol.replan, overhead=overhead))
    cores: list[Core] = [metrics, scheduler, PlacerCore(cl)]
    cores += [SimNodeCore(node, overhead) for node in cl.nodes]
    cores += list(extra)
    clock = VirtualClock(kernel)
    shells = [Shell(core, bus, clock, run_id="it") for core in cores]
    return Pipeline(kernel, bus, metrics, scheduler, shells)


class RecordingBus:
    """Wraps a bus and records every accepted publish as (subject, envelope or raw bytes)."""

    def __init__(self, inner: Bus) -> None:
        self.inner = inner
        self.stats: BusStats = inner.stats
        self.published: list[tuple[str, Envelope | bytes]] = []

    async def publish(self, subject: str, env: Envelope) -> bool:
        ok = await self.inner.publish(subject, env)
        if ok:
            self.published.append((subject, env))
        return ok

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None = None) -> bool:
        ok = await self.inner.publish_raw(subject, payload, msg_id)
        if ok:
            self.published.append((subject, payload))
        return ok

    async def subscribe(
        self, subject: str, handler: Handler, *, durable: str, decoder: Decoder = decode_any,
        wants: Wants | None = None,
    ) -> None:
        await self.inner.subscribe(subject, handler, durable=durable, decoder=decoder,
                                   wants=wants)

    async def flush(self) -> None:
        await self.inner.flush()

    async def close(self) -> None:
        await self.inner.close()


class Collector:
    """A subscriber that keeps what it is handed."""

    def __init__(self) -> None:
        self.got: list[Envelope] = []

    async def __call__(self, env: Envelope) -> None:
        self.got.append(env)


@asynccontextmanager
async def nats_bus(url: str, run_id: str, kernel: SimKernel | None = None
                   ) -> AsyncIterator[NatsSimBus]:
    bus = await NatsSimBus.open(kernel or SimKernel(), url, run_id=run_id)
    try:
        yield bus
    finally:
        await bus.close()


@asynccontextmanager
async def probe(url: str) -> AsyncIterator[Any]:
    """A separate client to inspect the server (the bus's own connection is drained on close)."""
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=1)
    try:
        yield nc
    finally:
        await nc.close()


async def stream_messages(nc: Any, stream: str) -> list[Any]:
    """Every message stored in `stream`, in stream order (RawStreamMsg: subject, data, headers)."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    first, last = info.state.first_seq, info.state.last_seq
    if info.state.messages == 0:
        return []
    return [await js.get_msg(stream, seq) for seq in range(first, last + 1)]
