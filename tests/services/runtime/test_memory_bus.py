from __future__ import annotations

import pytest

from schemas import subjects
from schemas.codec import encode
from schemas.events import CycleStarted, DeadLetter, Envelope, envelope
from schemas.job import SubmitJob
from services.runtime.bus import DuplicateWindow, Interest, MemoryBus, decode_submit
from services.runtime.kernel import SimKernel
from services.runtime.stream_limits import DUPLICATE_WINDOW_S


def _env(event_id: str, cycle: int = 1) -> Envelope:
    return envelope(CycleStarted(cycle=cycle, trigger="t"), event_id=event_id, occurred_at=0.0,
                    producer="test", causation_id=None)


async def _collect(bus: MemoryBus, subject: str, durable: str = "t", **kw):  # type: ignore[no-untyped-def]
    got: list[Envelope] = []

    async def handler(env: Envelope) -> None:
        got.append(env)

    await bus.subscribe(subject, handler, durable=durable, **kw)
    return got


async def test_delivers_in_publish_order_to_every_matching_subscriber() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    a = await _collect(bus, "loom.sched.*", "a")
    b = await _collect(bus, "loom.>", "b")
    c = await _collect(bus, "loom.jobs.submit", "c")
    for i in range(3):
        assert await bus.publish(subjects.CYCLE_STARTED, _env(f"e{i}", i))
    await k.run()
    assert [e.event_id for e in a] == ["e0", "e1", "e2"]
    assert [e.event_id for e in b] == ["e0", "e1", "e2"]
    assert c == []


async def test_duplicate_event_ids_are_dropped_like_jetstream() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    got = await _collect(bus, subjects.CYCLE_STARTED)
    assert await bus.publish(subjects.CYCLE_STARTED, _env("same"))
    assert not await bus.publish(subjects.CYCLE_STARTED, _env("same", 2))
    await k.run()
    assert len(got) == 1 and bus.stats.duplicates == 1


async def test_undecodable_payload_is_dead_lettered_with_reason_and_delivery_continues() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    got = await _collect(bus, subjects.JOB_SUBMIT, "scheduler", decoder=decode_submit)
    dead = await _collect(bus, "loom.deadletter.>", "audit")
    await bus.publish_raw(subjects.JOB_SUBMIT, b"\xc1 not msgpack")
    await bus.publish_raw(subjects.JOB_SUBMIT, b'{"model": "m", "gpus": 0}')
    ok = b'{"model": "resnet50", "gpus": 2, "iterations": 10, "iteration_time_s": 1}'
    await bus.publish_raw(subjects.JOB_SUBMIT, ok)
    await k.run()
    assert len(got) == 1 and isinstance(got[0].body, SubmitJob) and got[0].body.gpus == 2
    reasons = [d.body.reason for d in dead if isinstance(d.body, DeadLetter)]
    assert len(reasons) == 2
    assert "not msgpack" in reasons[0]
    assert "gpus" in reasons[1] and "iterations" in reasons[1]
    assert dead[1].body.payload == b'{"model": "m", "gpus": 0}'  # type: ignore[attr-defined]
    assert bus.stats.dead_lettered == 2


async def test_raw_msgpack_envelope_is_decoded() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    got = await _collect(bus, subjects.CYCLE_STARTED)
    await bus.publish_raw(subjects.CYCLE_STARTED, encode(_env("x", 7)), msg_id="x")
    await bus.publish_raw(subjects.CYCLE_STARTED, encode(_env("x", 7)), msg_id="x")
    await k.run()
    assert [e.body for e in got] == [CycleStarted(cycle=7, trigger="t")]


async def test_a_subscriber_gets_only_what_it_wants_and_others_still_get_everything() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    picky = await _collect(bus, subjects.CYCLE_STARTED, "picky",
                           wants=lambda env: env.body.cycle % 2 == 0)
    every = await _collect(bus, subjects.CYCLE_STARTED, "every")
    for i in range(5):
        await bus.publish(subjects.CYCLE_STARTED, _env(f"e{i}", i))
    await k.run()
    assert [e.body.cycle for e in picky] == [0, 2, 4]
    assert [e.body.cycle for e in every] == [0, 1, 2, 3, 4]
    assert bus.stats.delivered == 8  # passed over is not delivered


async def test_an_interest_switch_gates_delivery_and_keeps_subscription_order() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    order: list[str] = []
    switches = [Interest(), Interest(on=True), Interest()]
    for i, interest in enumerate(switches):
        async def handler(env: Envelope, name: str = f"s{i}") -> None:
            order.append(f"{name}:{env.body.cycle}")  # type: ignore[attr-defined]

        await bus.subscribe(subjects.CYCLE_STARTED, handler, durable=f"s{i}", wants=interest)
    await bus.publish(subjects.CYCLE_STARTED, _env("e0", 0))
    await k.run()
    switches[2].set(True)
    switches[0].set(True)
    switches[1].set(False)
    await bus.publish(subjects.CYCLE_STARTED, _env("e1", 1))
    await k.run()
    assert order == ["s1:0", "s0:1", "s2:1"]  # only those on, in the order they subscribed
    assert bus.stats.delivered == 3


async def test_an_interest_flipped_before_delivery_counts_not_the_one_at_publish() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    interest = Interest()
    got = await _collect(bus, subjects.CYCLE_STARTED, wants=interest)
    await bus.publish(subjects.CYCLE_STARTED, _env("e0"))
    interest.set(True)  # published while off, delivered while on: delivered
    await k.run()
    assert len(got) == 1


async def test_routes_rebuilt_by_a_later_subscription_stop_watching_the_old_ones() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    interest = Interest(on=True)
    got = await _collect(bus, subjects.CYCLE_STARTED, "a", wants=interest)
    await bus.publish(subjects.CYCLE_STARTED, _env("e0"))
    await k.run()
    late = await _collect(bus, subjects.CYCLE_STARTED, "b")
    interest.set(False)
    interest.set(True)
    await bus.publish(subjects.CYCLE_STARTED, _env("e1"))
    await k.run()
    assert len(got) == 2 and len(late) == 1
    assert len(interest._watchers) == 1  # the first route's watcher went with it


async def test_duplicates_are_dropped_within_the_window_and_forgotten_after_it() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    got = await _collect(bus, subjects.CYCLE_STARTED)
    window = DUPLICATE_WINDOW_S
    published: list[bool] = []
    for at, event_id in [(0.0, "a"), (window, "a"), (window + 1.0, "a"), (window + 2.0, "b")]:
        k.schedule(at, 0, lambda e=event_id: _publish(bus, published, e))
    await k.run()
    # "a" again at the window's edge is a duplicate; a second later "a" was forgotten.
    assert published == [True, False, True, True]
    assert len(got) == 3 and bus.stats.duplicates == 1


async def _publish(bus: MemoryBus, published: list[bool], event_id: str) -> None:
    published.append(await bus.publish(subjects.CYCLE_STARTED, _env(event_id)))


def test_the_window_keeps_only_recent_ids() -> None:
    k = SimKernel()
    seen = DuplicateWindow(k, window_s=10.0)
    for i in range(1000):
        k.now = float(i)
        assert seen.first(f"e{i}")
    assert len(seen._ids) == 11  # the ids of the last 10 s, and the one at its edge


@pytest.mark.parametrize(("published", "expected"), [
    pytest.param([(0.0, "a"), (0.0, "b"), (0.0, "a")], [True, True, False], id="one-instant"),
    pytest.param([(0.0, "a"), (0.0, "b"), (5.0, "b"), (10.0, "a"), (10.5, "a"), (15.5, "b")],
                 [True, True, False, False, True, True], id="forgotten-an-instant-at-a-time"),
])
def test_repeats_are_found_within_an_instant_and_across_instants(
        published: list[tuple[float, str]], expected: list[bool]) -> None:
    k = SimKernel()
    seen = DuplicateWindow(k, window_s=10.0)
    got = []
    for at, event_id in published:
        k.now = at
        got.append(seen.first(event_id))
    assert got == expected


async def test_literal_and_wildcard_subscribers_are_served_in_subscription_order() -> None:
    k = SimKernel()
    bus = MemoryBus(k)
    order: list[str] = []
    for name, pattern in [("first", subjects.CYCLE_STARTED), ("second", "loom.>"),
                          ("third", subjects.CYCLE_STARTED), ("other", "loom.jobs.submit")]:
        async def handler(env: Envelope, name: str = name) -> None:
            order.append(name)

        await bus.subscribe(pattern, handler, durable=name)
    await bus.publish(subjects.CYCLE_STARTED, _env("e0"))
    await k.run()
    assert order == ["first", "second", "third"]
