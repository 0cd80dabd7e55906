"""Bounded storage on a live cluster (docs/architecture.md, "Bounded storage"): the event
stream and the dead-letter stream are created with their limits, an existing stream is left
alone (with a warning naming what differs), dead letters keep a bounded copy, a flood of junk
stays bounded, and a full event stream refuses new messages without losing old ones."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
import pytest
from nats.js.api import DiscardPolicy, StreamConfig
from structlog.testing import capture_logs

from loom.serve import ServeOptions, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import MAX_EVENT_BYTES, decode, encode
from schemas.events import DEAD_LETTER_KEEP, DEAD_LETTER_REASON_KEEP, DeadLetter, envelope
from services.runtime.bus import decode_submit
from services.runtime.nats_live import (
    NatsLiveBus,
    PublishFailed,
    ensure_stream,
    event_stream_config,
)
from services.runtime.natsserver import EmbeddedNats
from services.runtime.stream_limits import (
    DEADLETTER_MAX_MSG_BYTES,
    DEFAULT_DEADLETTER_MAX_BYTES,
    DEFAULT_MAX_BYTES,
    GIB,
    KIB,
    MIB,
    StreamLimits,
    deadletter_stream,
    differences,
    parse_age,
    parse_bytes,
)

# -- the limits themselves ------------------------------------------------------------------


def test_the_defaults_are_8_gib_no_age_limit_and_256_mib_of_dead_letters() -> None:
    limits = StreamLimits()
    assert (limits.max_bytes, limits.max_age_s, limits.deadletter_max_bytes) == (
        8 * GIB, 0.0, 256 * MIB) == (DEFAULT_MAX_BYTES, 0.0, DEFAULT_DEADLETTER_MAX_BYTES)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_bytes": 1000}, "--stream-max-bytes 1000: must be at least 1048576 bytes"),
    ({"max_bytes": 2.5 * MIB}, "--stream-max-bytes must be a whole number of bytes"),
    ({"max_bytes": True}, "--stream-max-bytes must be a whole number of bytes"),
    ({"deadletter_max_bytes": 4096}, "--deadletter-max-bytes 4096: must be at least 16384"),
    ({"max_age_s": -1.0}, "--stream-max-age -1 s: 0 (no age limit) or from 600 s"),
    ({"max_age_s": 60.0}, "--stream-max-age 60 s: 0 (no age limit) or from 600 s"),
    ({"max_age_s": 1e10}, "--stream-max-age 1e[+]10 s: 0 (no age limit) or from 600 s"),
    ({"max_age_s": float("inf")}, "--stream-max-age must be a finite number of seconds"),
    ({"max_age_s": "30d"}, "--stream-max-age must be a finite number of seconds"),
])
def test_a_bad_limit_is_refused_naming_its_option(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StreamLimits(**kwargs)


def test_an_age_limit_that_outlasts_the_duplicate_window_is_accepted() -> None:
    assert StreamLimits(max_age_s=30 * 86400.0).max_age_s == 30 * 86400.0


@pytest.mark.parametrize(("text", "size"), [
    ("8589934592", 8 * GIB), ("8G", 8 * GIB), ("8GiB", 8 * GIB), ("8gb", 8 * GIB),
    ("256M", 256 * MIB), ("512k", 512 * KIB), ("1T", 1 << 40), (" 2 MiB ", 2 * MIB),
])
def test_sizes_parse_with_binary_units(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("86400", 86400.0), ("90m", 5400.0), ("36h", 129600.0), ("30d", 2592000.0),
    ("2w", 1209600.0), ("1.5h", 5400.0), ("600s", 600.0),
])
def test_ages_parse_in_seconds_or_with_a_unit(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "8X", "-1", "8 GB extra", "1e9"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes(text)


@pytest.mark.parametrize("text", ["", "30y", "-5", "d"])
def test_an_age_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not an age"):
        parse_age(text)


def test_differences_name_each_setting_that_differs_and_ignore_spelling() -> None:
    wanted = event_stream_config("LOOM", "", 1, StreamLimits())
    same = StreamConfig(name="LOOM", subjects=list(reversed(wanted.subjects or [])),
                        max_bytes=wanted.max_bytes, max_age=0, max_msg_size=MAX_EVENT_BYTES,
                        discard="new")  # type: ignore[arg-type]  # as the server answers
    assert differences(same, wanted) == {}
    old = StreamConfig(name="LOOM", subjects=["loom.>"], max_bytes=-1, max_age=None,
                       max_msg_size=-1, discard=DiscardPolicy.OLD)
    assert differences(old, wanted) == {
        "subjects": f"has ['loom.>'], asked for {sorted(wanted.subjects or [])}",
        "max_bytes": f"has -1, asked for {8 * GIB}",
        "max_msg_size": f"has -1, asked for {MAX_EVENT_BYTES}",
        "discard": "has old, asked for new"}


# -- dead letters keep a bounded copy --------------------------------------------------------


def test_a_dead_letter_keeps_the_start_of_the_payload_and_of_the_reason() -> None:
    dl = DeadLetter.kept(subject="loom.jobs.submit", service="scheduler", reason="r" * 5000,
                         payload=b"x" * 60_000)
    assert dl.payload == b"x" * DEAD_LETTER_KEEP and dl.reason == "r" * DEAD_LETTER_REASON_KEEP
    assert dl.cut() == dl  # cutting twice changes nothing
    small = DeadLetter.kept(subject="s", service="v", reason="why", payload=b"abc")
    assert (small.reason, small.payload) == ("why", b"abc")


def test_the_largest_dead_letter_fits_the_dead_letter_streams_message_limit() -> None:
    dl = DeadLetter.kept(subject="loom." + "s" * 4090, service="nodeagent-" + "n" * 118,
                         reason="\U0001f4a5" * 5000, payload=b"\xff" * 100_000)
    env = envelope(dl, event_id="dlq." + "n" * 128 + ".123456789", occurred_at=1e12,
                   producer="nodeagent-" + "n" * 118, causation_id="c" * 300)
    assert len(encode(env)) < DEADLETTER_MAX_MSG_BYTES - 1024  # room for the headers


# -- on a real nats-server -------------------------------------------------------------------

pytest_nats = pytest.mark.nats


async def _js(server: EmbeddedNats) -> tuple[Any, Any]:
    nc = await nats.connect(server.url)
    return nc, nc.jetstream()


@pytest_nats
async def test_both_streams_are_created_with_their_limits(nats_server: EmbeddedNats) -> None:
    nc, js = await _js(nats_server)
    try:
        limits = StreamLimits(max_bytes=64 * MIB, max_age_s=7 * 86400.0,
                              deadletter_max_bytes=2 * MIB)
        assert await ensure_stream(js, limits=limits) == subjects.DEADLETTER_STREAM
        events = (await js.stream_info(subjects.STREAM)).config
        assert sorted(events.subjects) == sorted(subjects.STREAM_SUBJECTS)
        assert (events.max_bytes, events.max_msg_size, events.discard, events.max_age) == (
            64 * MIB, MAX_EVENT_BYTES, DiscardPolicy.NEW, 7 * 86400.0)
        dead = (await js.stream_info(subjects.DEADLETTER_STREAM)).config
        assert dead.subjects == list(subjects.DEADLETTER_SUBJECTS)
        assert (dead.max_bytes, dead.max_msg_size, dead.discard, dead.max_age) == (
            2 * MIB, DEADLETTER_MAX_MSG_BYTES, DiscardPolicy.OLD, 0.0)
        # A second service asking for the same leaves them as they are, without a word.
        with capture_logs() as logs:
            assert await ensure_stream(js, limits=limits) == subjects.DEADLETTER_STREAM
        assert [e for e in logs if e["log_level"] == "warning"] == []
    finally:
        await nc.close()


@pytest_nats
async def test_an_existing_stream_is_left_alone_and_the_differences_are_logged(
        nats_server: EmbeddedNats) -> None:
    nc, js = await _js(nats_server)
    try:
        await ensure_stream(js, limits=StreamLimits(max_bytes=64 * MIB))
        with capture_logs() as logs:
            await ensure_stream(js, limits=StreamLimits(max_bytes=128 * MIB,
                                                        deadletter_max_bytes=1 * MIB))
        warned = {e["stream"]: e for e in logs if e["log_level"] == "warning"}
        assert warned[subjects.STREAM]["max_bytes"] == f"has {64 * MIB}, asked for {128 * MIB}"
        assert warned[subjects.DEADLETTER_STREAM]["max_bytes"] == (
            f"has {256 * MIB}, asked for {1 * MIB}")
        assert (await js.stream_info(subjects.STREAM)).config.max_bytes == 64 * MIB
    finally:
        await nc.close()


@pytest_nats
async def test_a_stream_made_before_dead_letters_had_their_own_keeps_them(
        nats_server: EmbeddedNats) -> None:
    """An older cluster's LOOM holds `loom.>`: JetStream refuses a second stream on part of
    it, so dead letters stay in LOOM (and the bus publishes them there)."""
    nc, js = await _js(nats_server)
    try:
        await js.add_stream(name=subjects.STREAM, subjects=["loom.>"])
        with capture_logs() as logs:
            bus = await NatsLiveBus.connect(nats_server.url, service="scheduler", now=time.time)
        assert bus.deadletters == subjects.STREAM
        assert any("predates" in e["event"] for e in logs)
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.stream_info(subjects.DEADLETTER_STREAM)
        await bus.subscribe(subjects.JOB_SUBMIT, _never, durable="scheduler",
                            decoder=decode_submit)
        await js.publish(subjects.JOB_SUBMIT, b"\xc1 junk")
        await _until(lambda: bus.stats.dead_lettered == 1)
        await bus.close()
        last = await js.get_last_msg(subjects.STREAM, subjects.deadletter("scheduler"))
        assert isinstance(decode(last.data).body, DeadLetter)
    finally:
        await nc.close()


async def _never(env: Any) -> None:
    raise AssertionError(f"junk was delivered: {env}")


async def _until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest_nats
async def test_a_full_event_stream_refuses_new_messages_and_keeps_every_old_one(
        nats_server: EmbeddedNats) -> None:
    bus = await NatsLiveBus.connect(nats_server.url, service="injector", now=time.time,
                                    limits=StreamLimits(max_bytes=1 * MIB))
    nc, js = await _js(nats_server)
    try:
        sent: list[bytes] = []
        refused = None
        for i in range(40):  # 40 × 60 KiB > 1 MiB
            payload = i.to_bytes(2, "big") + b"j" * (60 * KIB)
            await bus.publish_raw(subjects.JOB_SUBMIT, payload, msg_id=f"junk.{i}")
            try:
                await bus.flush(retry_s=0.5)
            except PublishFailed as exc:
                refused = (i, str(exc))
                break
            sent.append(payload)
        assert refused is not None and "maximum bytes exceeded" in refused[1]
        assert len(sent) == refused[0] >= 1 * MIB // (62 * KIB)  # what fits, no more
        info = await js.stream_info(subjects.STREAM)
        assert info.state.messages == len(sent) and info.state.first_seq == 1
        assert info.state.bytes <= 1 * MIB
        for seq, payload in enumerate(sent, start=1):  # nothing old was dropped to make room
            assert (await js.get_msg(subjects.STREAM, seq)).data == payload
    finally:
        await bus.close()
        await nc.close()


@pytest_nats
async def test_a_dead_letter_over_its_streams_message_limit_is_refused(
        nats_server: EmbeddedNats) -> None:
    nc, js = await _js(nats_server)
    try:
        await ensure_stream(js)
        dead = deadletter_stream(subjects.STREAM)
        with pytest.raises(nats.js.errors.APIError, match="message size exceeds maximum"):
            await js.publish(subjects.deadletter("x"), b"d" * (DEADLETTER_MAX_MSG_BYTES + 1),
                             stream=dead)
    finally:
        await nc.close()


@pytest_nats
async def test_a_flood_of_junk_submissions_leaves_the_dead_letters_bounded(
        nats_server: EmbeddedNats) -> None:
    """300 junk submissions of 60 KiB against a live scheduler: each is stored once in LOOM
    (the original, at the sequence its dead letter names) and dead-lettered with a 4 KiB
    copy in a dead-letter stream that keeps within its bound by dropping the oldest."""
    bound = 512 * KIB
    stop = asyncio.Event()
    opts = ServeOptions("scheduler", nats_server.url, ClusterSpec.uniform(1, 1, 2),
                        stream_limits=StreamLimits(deadletter_max_bytes=bound))
    run = asyncio.create_task(serve(opts, stop))
    nc, js = await _js(nats_server)
    try:
        await _until_async(lambda: _pinged(nc, "scheduler"))
        for i in range(300):
            await nc.publish(subjects.JOB_SUBMIT, b"\xc1" + i.to_bytes(2, "big") * (30 * KIB))
        await nc.flush()

        async def all_dead_lettered() -> bool:
            info = await js.stream_info(subjects.DEADLETTER_STREAM)
            return bool(info.state.last_seq == 300)
        await _until_async(all_dead_lettered)
        dead = await js.stream_info(subjects.DEADLETTER_STREAM)
        assert dead.state.bytes <= bound and dead.state.messages < 300  # the oldest dropped
        assert dead.state.first_seq == 300 - dead.state.messages + 1
        for seq in range(dead.state.first_seq, 301):
            env = decode((await js.get_msg(subjects.DEADLETTER_STREAM, seq)).data)
            letter = env.body
            assert isinstance(letter, DeadLetter) and letter.service == "scheduler"
            assert len(letter.payload) == DEAD_LETTER_KEEP
            original = int(env.event_id.rsplit(".", 1)[1])  # dlq.scheduler.<LOOM sequence>
            whole = (await js.get_msg(subjects.STREAM, original)).data
            assert len(whole) > 60 * KIB and whole.startswith(letter.payload)
        events = await js.stream_info(subjects.STREAM)
        assert events.state.messages == 300  # every original kept, once
        assert events.state.bytes < 300 * 61 * KIB
    finally:
        stop.set()
        assert await run == 0
        await nc.close()


async def _pinged(nc: Any, service: str) -> bool:
    return service in await ping(nc, 0.1)


async def _until_async(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
