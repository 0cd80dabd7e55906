"""The live bus over a real nats-server: services in their own connections, durable consumers.

Each test gets a fresh server (the `nats_server` fixture) and talks to it the way separate
service processes would: one connection per service.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from schemas import subjects
from schemas.events import CycleStarted, DeadLetter, Envelope, envelope
from services.runtime.nats_live import NatsLiveBus, consumer_name, server_list
from services.runtime.natsserver import EmbeddedNats
from services.runtime.service import RetryLater

pytestmark = pytest.mark.nats


def cycle(n: int) -> Envelope:
    return envelope(CycleStarted(cycle=n, trigger="test"), event_id=f"cycle.{n}",
                    occurred_at=float(n), producer="test", causation_id=None)


async def connect(server: EmbeddedNats, service: str) -> NatsLiveBus:
    return await NatsLiveBus.connect(server.url, service=service, now=time.time)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def test_a_service_receives_what_another_publishes(nats_server: EmbeddedNats) -> None:
    sender, receiver = await connect(nats_server, "s"), await connect(nats_server, "r")
    got: list[Envelope] = []

    async def handle(env: Envelope) -> None:
        got.append(env)

    await receiver.subscribe(subjects.CYCLE_STARTED, handle, durable="r")
    for n in range(5):
        assert await sender.publish(subjects.CYCLE_STARTED, cycle(n))
    await until(lambda: len(got) == 5)
    assert [e.body.cycle for e in got] == [0, 1, 2, 3, 4]  # type: ignore[attr-defined]
    await sender.publish(subjects.CYCLE_STARTED, cycle(0))  # the same event id again
    await sender.flush()
    assert sender.stats.duplicates == 1 and sender.stats.published == 5
    await sender.close()
    await receiver.close()


async def test_a_restarted_service_resumes_after_what_it_acknowledged(
        nats_server: EmbeddedNats) -> None:
    sender = await connect(nats_server, "s")
    first = await connect(nats_server, "r")
    got: list[int] = []

    async def handle(env: Envelope) -> None:
        got.append(env.body.cycle)  # type: ignore[attr-defined]

    await first.subscribe(subjects.CYCLE_STARTED, handle, durable="r")
    await sender.publish(subjects.CYCLE_STARTED, cycle(1))
    await until(lambda: got == [1])
    await first.close()  # the service goes away; messages go on
    await sender.publish(subjects.CYCLE_STARTED, cycle(2))
    await sender.publish(subjects.CYCLE_STARTED, cycle(3))
    again = await connect(nats_server, "r")
    await again.subscribe(subjects.CYCLE_STARTED, handle, durable="r")
    await until(lambda: len(got) == 3)
    await asyncio.sleep(0.2)
    assert got == [1, 2, 3]  # nothing lost, nothing twice
    await again.close()
    await sender.close()


async def test_a_handler_failure_is_redelivered(nats_server: EmbeddedNats) -> None:
    sender, receiver = await connect(nats_server, "s"), await connect(nats_server, "r")
    attempts: list[int] = []

    async def flaky(env: Envelope) -> None:
        attempts.append(env.body.cycle)  # type: ignore[attr-defined]
        if len(attempts) == 1:
            raise RuntimeError("transient")

    # A short ack wait so the redelivery comes quickly in the test.
    from services.runtime import nats_live
    saved, nats_live.ACK_WAIT_S = nats_live.ACK_WAIT_S, 0.5
    try:
        await receiver.subscribe(subjects.CYCLE_STARTED, flaky, durable="r")
    finally:
        nats_live.ACK_WAIT_S = saved
    await sender.publish(subjects.CYCLE_STARTED, cycle(7))
    await until(lambda: len(attempts) == 2)
    assert attempts == [7, 7]
    await receiver.close()
    await sender.close()


async def test_a_retry_later_waits_in_place_for_what_it_depends_on(
        nats_server: EmbeddedNats) -> None:
    """A handler answering RetryLater keeps its message (no redelivery, no dead letter) until
    the input it waits for arrives on another subscription, however many tries that takes."""
    sender, receiver = await connect(nats_server, "s"), await connect(nats_server, "r")
    arrived: list[int] = []
    handled: list[tuple[int, int]] = []  # (cycle, delivery count of its message)
    tries = 0

    async def needs_seven(env: Envelope) -> None:
        nonlocal tries
        tries += 1
        if 7 not in arrived:
            raise RetryLater("cycle 7 not seen yet")
        handled.append((env.body.cycle, tries))  # type: ignore[attr-defined]

    async def note(env: Envelope) -> None:
        arrived.append(env.body.cycle)  # type: ignore[attr-defined]

    # Two consumers of one subject: cycle 7 reaches `notes` while `waits` still holds 8.
    await receiver.subscribe(subjects.CYCLE_STARTED, needs_seven, durable="waits")
    await receiver.subscribe(subjects.CYCLE_STARTED, note, durable="notes")
    await sender.publish(subjects.CYCLE_STARTED, cycle(8))
    await sender.flush()
    await until(lambda: tries >= 4, timeout=30)  # 0.5 + 1 + 2 s of waiting
    await sender.publish(subjects.CYCLE_STARTED, cycle(7))
    await until(lambda: len(handled) == 2, timeout=30)
    assert handled[0][0] == 8 and handled[0][1] >= 5 and handled[1] == (7, handled[0][1] + 1)
    assert receiver.stats.dead_lettered == 0
    assert receiver.stats.delivered == 4  # 8 and 7 to each consumer, once
    await receiver.close()
    await sender.close()


async def test_an_undecodable_payload_is_dead_lettered_and_the_next_goes_through(
        nats_server: EmbeddedNats) -> None:
    sender, receiver = await connect(nats_server, "s"), await connect(nats_server, "r")
    audit = await connect(nats_server, "audit")
    got: list[Envelope] = []
    dead: list[Envelope] = []

    async def handle(env: Envelope) -> None:
        got.append(env)

    async def keep(env: Envelope) -> None:
        dead.append(env)

    await receiver.subscribe(subjects.CYCLE_STARTED, handle, durable="r")
    await audit.subscribe(subjects.deadletter("r"), keep, durable="audit")
    await sender.publish_raw(subjects.CYCLE_STARTED, b"\xc1 not msgpack", msg_id="junk")
    await sender.publish(subjects.CYCLE_STARTED, cycle(1))
    await until(lambda: len(got) == 1 and len(dead) == 1)
    letter = dead[0].body
    assert isinstance(letter, DeadLetter)
    assert letter.subject == subjects.CYCLE_STARTED and letter.payload == b"\xc1 not msgpack"
    assert letter.reason
    for bus in (sender, receiver, audit):
        await bus.close()


def test_consumer_names_are_valid_and_distinct() -> None:
    a = consumer_name("node agent.1", "loom.node.*.command")
    b = consumer_name("node agent.1", "loom.sched.cycle")
    assert a != b
    assert not set(a) & set(".*> ")


async def test_publishing_outside_the_stream_is_refused(nats_server: EmbeddedNats) -> None:
    bus = await connect(nats_server, "s")
    with pytest.raises(ValueError, match="outside the cluster's stream"):
        await bus.publish_raw("other.subject", b"x")
    await bus.close()


@pytest.mark.parametrize(("url", "servers"), [
    ("nats://a:4222", ["nats://a:4222"]),
    ("nats://a:4222, nats://b:4223,", ["nats://a:4222", "nats://b:4223"]),
])
def test_a_url_may_list_the_servers_of_a_cluster(url: str, servers: list[str]) -> None:
    assert server_list(url) == servers


def test_an_empty_url_is_refused() -> None:
    with pytest.raises(ValueError, match="--nats-url is empty"):
        server_list(" , ")
