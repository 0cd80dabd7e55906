"""A core that raises on one message: the shell dead-letters it and the service goes on."""

from __future__ import annotations

import io
import sys
from collections.abc import AsyncIterator, Hashable, Sequence
from contextlib import asynccontextmanager

import pytest

from schemas import subjects
from schemas.codec import decode
from schemas.events import CycleStarted, DeadLetter, Envelope, JobTransition, envelope
from services.injector.core import InjectorCore
from services.runtime.bus import Bus, MemoryBus
from services.runtime.clock import VirtualClock
from services.runtime.effects import Effect, Publish, SetTimer
from services.runtime.kernel import SimKernel
from services.runtime.logging import configure
from services.runtime.natsserver import EmbeddedNats
from services.runtime.service import Shell, Subscribe
from tests.builders import cluster, make_job
from tests.integration.pipeline import Collector, build_pipeline, nats_bus

ECHO = "loom.sched.echo"  # under loom.>, so the NATS stream stores it


class Fragile:
    """Echoes each cycle number; raises on the ones in `bad`; its timers fail on `bad` too."""

    name = "fragile"

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad
        self.seen: list[int] = []
        self.fired: list[int] = []

    def subscriptions(self) -> Sequence[Subscribe]:
        return (Subscribe(subjects.CYCLE_STARTED),)

    def start(self, now: float) -> list[Effect]:
        return [SetTimer(("t", i), 100.0 + i) for i in range(4)]

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        cycle = env.body.cycle  # type: ignore[attr-defined]
        if cycle in self.bad:
            raise ValueError(f"cannot digest cycle {cycle}")
        self.seen.append(cycle)
        return [Publish(ECHO, CycleStarted(cycle=cycle, trigger="echo"))]

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        assert isinstance(key, tuple)
        if key[1] in self.bad:
            raise RuntimeError(f"timer {key[1]} broke")
        self.fired.append(key[1])
        return []


@pytest.fixture(params=["memory", "nats"])
def bus_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def open_bus(kind: str, kernel: SimKernel, server: EmbeddedNats, run_id: str
                   ) -> AsyncIterator[Bus]:
    if kind == "memory":
        yield MemoryBus(kernel)
    else:
        async with nats_bus(server.url, run_id, kernel) as bus:
            yield bus


def _cycle(i: int) -> Envelope:
    return envelope(CycleStarted(cycle=i, trigger="test"), event_id=f"in-{i}",
                    occurred_at=0.0, producer="test", causation_id=None)


async def test_core_exception_is_dead_lettered_and_later_messages_are_processed(
    bus_kind: str, nats_server: EmbeddedNats
) -> None:
    kernel = SimKernel()
    async with open_bus(bus_kind, kernel, nats_server, "fragile") as bus:
        core = Fragile(bad={2, 4})
        shell = Shell(core, bus, VirtualClock(kernel), run_id="r")
        await shell.start()
        echoes, dead = Collector(), Collector()
        await bus.subscribe(ECHO, echoes, durable="echo-reader")
        await bus.subscribe("loom.deadletter.>", dead, durable="audit")
        for i in range(1, 7):
            await bus.publish(subjects.CYCLE_STARTED, _cycle(i))
        await kernel.run()

        assert core.seen == [1, 3, 5, 6]
        assert [e.body.cycle for e in echoes.got] == [1, 3, 5, 6]  # type: ignore[attr-defined]
        assert [e.causation_id for e in echoes.got] == ["in-1", "in-3", "in-5", "in-6"]
        # Timers: the failing one is counted, the others still fire.
        assert core.fired == [0, 1, 3]
        assert shell.errors == 2 + 1

        assert len(dead.got) == 2
        for dl_env, cycle in zip(dead.got, (2, 4), strict=True):
            dl = dl_env.body
            assert isinstance(dl, DeadLetter)
            assert dl.service == "fragile"
            assert dl.subject == "loom.cycle.started.v1"
            assert dl.reason == f"ValueError: cannot digest cycle {cycle}"
            assert decode(dl.payload) == _cycle(cycle)  # the failed message, intact
            assert dl_env.causation_id == f"in-{cycle}"
            assert dl_env.producer == "fragile"
        assert bus.stats.dead_lettered == 0  # decoding was fine; the core failed


async def test_a_failing_observer_does_not_stop_the_pipeline(
    bus_kind: str, nats_server: EmbeddedNats
) -> None:
    class Grumpy:
        """Listens to transitions and fails on every third one."""

        name = "grumpy"

        def __init__(self) -> None:
            self.n = 0

        def subscriptions(self) -> Sequence[Subscribe]:
            return (Subscribe(subjects.JOB_TRANSITION),)

        def start(self, now: float) -> list[Effect]:
            return []

        def handle(self, env: Envelope, now: float) -> list[Effect]:
            assert isinstance(env.body, JobTransition)
            self.n += 1
            if self.n % 3 == 0:
                raise KeyError(env.body.job_id)
            return []

        def on_timer(self, key: Hashable, now: float) -> list[Effect]:
            return []

    jobs = [make_job(f"p{i}").gpus(1 + i % 3).runs_for(30 + 10 * i).submit(3.0 * i).build()
            for i in range(9)]
    kernel = SimKernel()
    async with open_bus(bus_kind, kernel, nats_server, "grumpy") as bus:
        grumpy = Grumpy()
        pipe = build_pipeline(kernel, bus, cluster(1, 4), "srtf",
                              extra=[grumpy, InjectorCore(jobs)])
        dead = Collector()
        await bus.subscribe("loom.deadletter.grumpy", dead, durable="audit")
        await pipe.start()
        await kernel.run()

    assert pipe.metrics.finished == 9
    assert grumpy.n >= 9 * 3  # queued, running, finished at least
    assert pipe.errors == grumpy.n // 3 == len(dead.got)
    assert all(d.body.reason.startswith("KeyError: ") for d in dead.got)  # type: ignore[attr-defined]


async def test_dead_lettering_does_not_depend_on_a_working_log_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = io.StringIO()
    gone.close()
    monkeypatch.setattr(sys, "stderr", gone)
    configure("warning")  # what `loom.cli.main` does; the conftest fixture restores it
    kernel = SimKernel()
    bus = MemoryBus(kernel)
    core = Fragile(bad={2})
    shell = Shell(core, bus, VirtualClock(kernel), run_id="r")
    await shell.start()
    dead = Collector()
    await bus.subscribe("loom.deadletter.>", dead, durable="audit")
    for i in range(1, 4):
        await bus.publish(subjects.CYCLE_STARTED, _cycle(i))
    await kernel.run(until=10.0)
    assert core.seen == [1, 3]
    assert len(dead.got) == 1
