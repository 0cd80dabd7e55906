"""Leader election over a real JetStream KV bucket: one replica leads, a crashed leader's
lease lapses and the standby takes over with the next term; a deposed leader is fenced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Sequence

import nats
import pytest

from schemas import subjects
from schemas.events import CycleStarted, Envelope
from services.runtime.clock import WallClock
from services.runtime.effects import Effect, Publish
from services.runtime.nats_live import NatsLiveBus
from services.runtime.natsserver import EmbeddedNats
from services.runtime.service import Subscribe
from services.scheduler.leader import (
    Elector,
    FencedShell,
    LeaseStore,
    NotLeader,
    Replica,
    Term,
)

pytestmark = pytest.mark.nats
LEASE, RENEW, SKEW = 1.2, 0.3, 0.2


class Quiet:
    """A core that publishes one cycle announcement per `on_timer`: what leading looks like."""

    name = "scheduler"

    def subscriptions(self) -> Sequence[Subscribe]:
        return ()

    def start(self, now: float) -> list[Effect]:
        return []

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        return []

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return [Publish(subjects.CYCLE_STARTED, CycleStarted(cycle=1, trigger=str(key)))]


async def replica(server: EmbeddedNats, me: str, log: list[tuple[str, int, float]],
                  closed: list[str]) -> tuple[Replica, NatsLiveBus]:
    bus = await NatsLiveBus.connect(server.url, service=me, now=time.time)
    store = await LeaseStore.open(bus.js)

    async def lead(term: int, leading: Callable[[], bool]) -> Term:
        log.append((me, term, time.time()))
        shell = FencedShell(Quiet(), bus, WallClock(), run_id=f"{me}.{term}", leading=leading)
        async def close() -> None:
            closed.append(me)
        return Term(shell, close)

    elector = Elector(me, lease_s=LEASE, renew_s=RENEW, skew_s=SKEW)
    return Replica(elector, store, lead), bus


async def test_standby_takes_over_when_the_leader_dies(nats_server: EmbeddedNats) -> None:
    log: list[tuple[str, int, float]] = []
    closed: list[str] = []
    (a, bus_a), (b, bus_b) = [await replica(nats_server, m, log, closed) for m in ("a", "b")]
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    run_a = asyncio.create_task(a.run(stop_a))
    await asyncio.sleep(0.5)  # a wins the empty key
    run_b = asyncio.create_task(b.run(stop_b))
    await asyncio.sleep(3 * RENEW)
    assert [(m, t) for m, t, _ in log] == [("a", 1)]
    assert a.leading() and not b.leading()

    run_a.cancel()  # a dies: no step-down, no release; its lease just stops being renewed
    died = time.time()
    with pytest.raises(asyncio.CancelledError):
        await run_a
    deadline = time.monotonic() + 10
    while not b.leading() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert [(m, t) for m, t, _ in log] == [("a", 1), ("b", 2)]
    took = log[-1][2] - died
    # No overlap: b leads only after a's own fence (its last renewal's send time + lease −
    # skew) has passed. Measured from a's last renewal, not from its death, so a renewal
    # that a busy machine delayed cannot make this fail.
    assert log[-1][2] >= a.elector.valid_until

    # a is fenced: its shell refuses to publish, and a's own view agrees.
    assert a.current is not None and not a.leading()
    with pytest.raises(NotLeader):
        await a.current.shell.apply(Quiet().on_timer("late", 0.0), None)
    stop_b.set()
    await run_b
    assert closed == ["b"]  # b stepped down cleanly at the end; a died holding its term
    for bus in (bus_a, bus_b):
        await bus.close()
    print(f"standby took over {took:.2f} s after the leader died (lease {LEASE} s)")


async def test_a_lease_survives_in_the_bucket_and_terms_only_grow(
        nats_server: EmbeddedNats) -> None:
    nc = await nats.connect(nats_server.url)
    store = await LeaseStore.open(nc.jetstream())
    terms = []
    for _ in range(3):  # each replica life is a new term, even for the same id
        e = Elector("a", lease_s=LEASE, renew_s=RENEW, skew_s=SKEW)
        w = e.observe(await store.read(), time.time())
        assert w is not None
        e.written(w, await store.write(w), time.time())
        terms.append(e.term)
    assert terms == [1, 2, 3]
    stale = e.observe(await store.read(), time.time())
    assert stale is not None
    await store.write(stale)  # renew: revision moves on
    assert await store.write(stale) == "conflict"  # the same revision again loses the CAS
    await nc.close()
