"""The live bus: one service per process, JetStream in between, wall-clock time.

Unlike the simulation's bus, nothing orders deliveries across services: each subscription is
a durable JetStream consumer of its own, named after the service and subject, so a service
that restarts resumes after the last message it acknowledged. A message is acknowledged once
its handler has returned and everything the handler published is stored (at-least-once); a
handler that raises, or whose publishes JetStream does not acknowledge, leaves it
unacknowledged, and JetStream redelivers it up to MAX_DELIVER times. A handler that answers
RetryLater (its input overtook one it depends on) keeps its message and is retried in place.

Publishes are pipelined: each is sent at once, in order on one connection, with the
envelope's `event_id` as `Nats-Msg-Id` (JetStream drops a duplicate within its window), and
the acknowledgements are awaited together (`flush`): one round trip for a cycle's plan and
transitions instead of one each. A payload no decoder accepts is dead-lettered on
`loom.deadletter.<service>` with the reason, then acknowledged. Dead letters go to a bounded
stream of their own (`ensure_stream`; limits in `services.runtime.stream_limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    StorageType,
    StreamConfig,
)

from schemas import subjects
from schemas.codec import MAX_EVENT_BYTES, check_origin, encode
from schemas.events import Envelope
from services.runtime.bus import (
    MSG_ID,
    BusStats,
    Decoder,
    Handler,
    Subscription,
    Wants,
    dead_letter_envelope,
    decode_any,
    decode_failure,
    fallback_id,
)
from services.runtime.logging import get_logger
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_errors import ErrorWatch, describe
from services.runtime.service import RetryLater
from services.runtime.stream_limits import (
    DEADLETTER_MAX_MSG_BYTES,
    DUPLICATE_WINDOW_S,
    StreamLimits,
    deadletter_stream,
    differences,
)

MAX_DELIVER = 5
ACK_WAIT_S = 60.0
PUBLISH_RETRY_S = 60.0  # how long `flush` keeps re-sending unacknowledged publishes
ACK_TIMEOUT_S = 5.0  # a publish not acknowledged by then is sent again (same Nats-Msg-Id)
RETRY_DELAY_S = 0.5  # a failed handler's message comes back after this × its delivery count
# How long a handler's RetryLater keeps its message waiting for the input it depends on. It
# must outlast a stalled sibling consumer: after a server restart an unacknowledged message
# comes back only after ACK_WAIT_S, and with one message in flight per consumer nothing
# behind it moves until then. It holds up its own consumer meanwhile, so it is not endless.
RETRY_LATER_S = 2 * ACK_WAIT_S

_log = get_logger("loom.bus")
T = TypeVar("T")


def consumer_name(service: str, subject: str) -> str:
    """A durable name per (service, subject): JetStream names allow no '.', '*' or '>'."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", service)
    return f"{safe}-{hashlib.sha1(subject.encode()).hexdigest()[:10]}"


def event_stream_config(stream: str, prefix: str, replicas: int,
                        limits: StreamLimits) -> StreamConfig:
    """The run's history: full, it refuses new messages rather than drop old ones."""
    return StreamConfig(
        name=stream, subjects=[prefix + s for s in subjects.STREAM_SUBJECTS],
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=DUPLICATE_WINDOW_S,
        max_bytes=limits.max_bytes, max_age=limits.max_age_s, max_msg_size=MAX_EVENT_BYTES,
        discard=DiscardPolicy.NEW)


def deadletter_stream_config(stream: str, prefix: str, replicas: int,
                             limits: StreamLimits) -> StreamConfig:
    """Diagnostic copies (the originals stay in the history): full, it drops its oldest."""
    return StreamConfig(
        name=deadletter_stream(stream),
        subjects=[prefix + s for s in subjects.DEADLETTER_SUBJECTS],
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=DUPLICATE_WINDOW_S,
        max_bytes=limits.deadletter_max_bytes, max_age=0.0,
        max_msg_size=DEADLETTER_MAX_MSG_BYTES, discard=DiscardPolicy.OLD)


async def ensure_stream(js: Any, stream: str = subjects.STREAM, prefix: str = "",
                        replicas: int = 1, limits: StreamLimits | None = None) -> str:
    """Create the cluster's event stream and its dead-letter stream (file storage,
    `replicas` copies on a NATS cluster, bounded by `limits`), or leave existing ones as they
    are: a service may lack the right to update a stream, and an operator may have changed
    it on purpose; a compared setting that differs from `limits` is logged as a warning.

    Returns the stream dead letters go to: the dead-letter stream, or the event stream
    itself where that was made before dead letters had their own (it holds `loom.>`, and
    JetStream refuses a second stream on part of its subjects)."""
    limits = limits or StreamLimits()
    events = await _ensure(js, event_stream_config(stream, prefix, replicas, limits))
    probe = prefix + subjects.deadletter("probe")
    if any(subjects.matches(pattern, probe) for pattern in events.subjects or ()):
        _log.warning("the event stream also holds dead letters (it predates their own "
                     "stream); they are not bounded apart from it", stream=stream)
        return stream
    await _ensure(js, deadletter_stream_config(stream, prefix, replicas, limits))
    return deadletter_stream(stream)


async def _ensure(js: Any, cfg: StreamConfig) -> StreamConfig:
    """The config of stream `cfg.name`, created as `cfg` if it did not exist."""
    try:
        info = await js.stream_info(cfg.name)
    except nats.js.errors.NotFoundError:
        try:
            created: StreamConfig = (await js.add_stream(cfg)).config
            return created
        except nats.js.errors.BadRequestError as exc:
            try:  # another service created it meanwhile?
                info = await js.stream_info(cfg.name)
            except nats.js.errors.NotFoundError:  # no: refused (another stream's subjects)
                raise exc from None
    if diff := differences(info.config, cfg):
        _log.warning("stream exists with other settings; left as it is", stream=cfg.name,
                     **diff)
    existing: StreamConfig = info.config
    return existing


class PublishFailed(RuntimeError):
    """JetStream did not acknowledge (store) a publish."""


def surface_publish_errors(js: Any) -> None:
    """Make JetStream's refusal of an async publish (a full stream: "maximum bytes
    exceeded") fail its acknowledgement. nats-py 2.16 raises it inside the reply handler
    instead, leaving the acknowledgement pending for ever (nats-io/nats.py#985), so `flush`
    would see only timeouts. A no-op where nats-py's internals differ."""
    handle = getattr(js, "_handle_async_reply", None)
    if handle is None or not hasattr(js, "_publish_async_futures"):
        return

    async def handle_reply(msg: Any) -> None:
        try:
            await handle(msg)
        except nats.js.errors.APIError as exc:
            for token, future in list((js._publish_async_futures or {}).items()):
                if msg.subject.endswith(token) and not future.done():
                    future.set_exception(exc)

    js._handle_async_reply = handle_reply


def server_list(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` → the servers a client may connect to."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise ValueError("--nats-url is empty")
    return servers


CONNECT_TIMEOUT_S = 5.0
# A service's first connect tries each server this many more times (0.5 s apart) before it
# gives up (systemd and compose restart it); once connected it reconnects for ever.
SERVICE_CONNECT_RETRIES = 10


async def connect_once(url: str, auth: NatsAuth | None = None, *,
                       watch: ErrorWatch | None = None, retries: int = 1,
                       **kwargs: Any) -> Any:
    """A client, or a `NatsProblem` naming why not: a refused login, a TLS failure, or no
    server at `url` (each server is tried 1 + `retries` times, without a traceback per
    attempt; nats-py's `max_reconnect_attempts=0` would retry for ever). `watch` hears the
    connection's errors afterwards (see `with_connection`)."""
    auth = auth or NatsAuth()
    watch = watch or ErrorWatch(url, auth)
    servers = server_list(url)
    connect_kwargs = {**auth.connect_kwargs(), **kwargs}

    def start(error_cb: Any) -> Any:
        return nats.connect(servers=servers, connect_timeout=CONNECT_TIMEOUT_S,
                            max_reconnect_attempts=retries, reconnect_time_wait=0.5,
                            error_cb=error_cb, **connect_kwargs)

    return await watch.connect(start)


async def with_connection(url: str, auth: NatsAuth | None,
                          work: Callable[[Any], Awaitable[T]]) -> T:
    """Connect (`connect_once`), run `work(client)`, close: the one way a one-shot command
    (`loom submit`, `status`, operator commands, `loom log export`) talks to NATS. A publish
    or subscription the server refuses meanwhile fails the work at once, naming the subject,
    instead of the request that waits on it timing out."""
    watch = ErrorWatch(url, auth)
    nc = await connect_once(url, auth, watch=watch)
    try:
        return await watch.guard(work(nc))
    finally:
        await nc.close()


class NatsLiveBus:
    def __init__(self, nc: Any, *, service: str, now: Callable[[], float],
                 stream: str = subjects.STREAM, prefix: str = "") -> None:
        self.nc = nc
        self.js = nc.jetstream()
        surface_publish_errors(self.js)
        self.service = service
        self.now = now
        self.stream = stream
        self.deadletters = deadletter_stream(stream)  # set by `connect` (see ensure_stream)
        self.prefix = prefix
        self.stats = BusStats()
        self.redelivers = True  # a handler's RetryLater comes back (see services.runtime.service)
        self._subs: list[Any] = []
        self._inflight: list[tuple[str, bytes, str | None, asyncio.Future[Any]]] = []
        # Set by a service that rebuilt its state from the stream: its consumers restart at
        # their acknowledgement floor, so what a dead predecessor held comes back at once
        # instead of after ack_wait (duplicates are harmless: handlers are idempotent).
        self.rewind = False

    @classmethod
    async def connect(cls, url: str, *, service: str, now: Callable[[], float],
                      stream: str = subjects.STREAM, prefix: str = "",
                      replicas: int = 1, auth: NatsAuth | None = None,
                      limits: StreamLimits | None = None) -> NatsLiveBus:
        """`url` may list several servers of a NATS cluster, comma-separated; `auth` the
        credentials and TLS files to connect with; `limits` those of the streams, if this
        service creates them. A refused login or TLS failure fails at once and an absent
        server after SERVICE_CONNECT_RETRIES tries, as a `NatsProblem` naming the cause;
        once connected, the client reconnects for ever."""
        async def error(exc: Exception) -> None:
            fields = describe(exc)
            if "permission_denied" in fields:  # the server dropped it: this role lacks a right
                _log.error("nats permission denied", service=service, **fields)
            else:
                _log.warning("nats client error", service=service, **fields)

        watch = ErrorWatch(url, auth, then=error)
        nc = await connect_once(url, auth, watch=watch, retries=SERVICE_CONNECT_RETRIES,
                                name=f"loom-{service}")
        # The first connect gave up on a wrong URL; a server restart later is waited out.
        nc.options["max_reconnect_attempts"] = -1
        bus = cls(nc, service=service, now=now, stream=stream, prefix=prefix)
        try:  # a role without the stream's rights is named now, not after a 5 s timeout
            bus.deadletters = await watch.guard(
                ensure_stream(bus.js, stream, prefix, replicas, limits))
        except BaseException:
            await nc.close()
            raise
        return bus

    async def publish(self, subject: str, env: Envelope) -> bool:
        return await self.publish_raw(subject, encode(env), env.event_id)

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None = None) -> bool:
        """Send now; the acknowledgement is awaited by `flush` (True: sent)."""
        if not subjects.matches(subjects.EVERY_SUBJECT, subject):
            raise ValueError(f"subject {subject!r} is outside the cluster's stream "
                             f"({subjects.EVERY_SUBJECT})")
        try:
            ack = await self._send(subject, payload, msg_id)
        except Exception as exc:  # disconnected (a server restart): `flush` sends it again
            ack = asyncio.get_running_loop().create_future()
            ack.set_exception(exc)
        self._inflight.append((subject, payload, msg_id, ack))
        self.stats.published += 1
        return True

    def stream_of(self, subject: str) -> str:
        """The stream that stores `subject` (a subscription's pattern, or a subject)."""
        return (self.deadletters if subject.startswith(subjects.DEADLETTER_PREFIX + ".")
                else self.stream)

    async def _send(self, subject: str, payload: bytes, msg_id: str | None) -> Any:
        headers = None if msg_id is None else {MSG_ID: msg_id}
        return await self.js.publish_async(self.prefix + subject, payload, headers=headers,
                                           stream=self.stream_of(subject))

    async def flush(self, retry_s: float = PUBLISH_RETRY_S) -> None:
        """Wait until JetStream has stored everything published so far; raise if it has not.

        A publish that was not acknowledged (say, the server restarted) is sent again with
        the same `Nats-Msg-Id`, for up to `retry_s`: if the first copy was stored after all,
        JetStream drops the second, so retrying never duplicates.
        """
        inflight, self._inflight = self._inflight, []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + retry_s
        pause = 0.1
        while True:
            failed = []
            for subject, payload, msg_id, ack in inflight:
                try:
                    # nats-py never times an acknowledgement out: one lost in a server restart
                    # would hang this flush (and the timer or handler behind it) for good.
                    if (await asyncio.wait_for(ack, ACK_TIMEOUT_S)).duplicate:
                        self.stats.duplicates += 1  # dropped by JetStream: already stored
                        self.stats.published -= 1
                except Exception as exc:  # not stored (yet): the caller must not count it
                    failed.append((subject, payload, msg_id, f"{type(exc).__name__}: {exc}"))
            if not failed:
                return
            if msg_id_missing := [f for f in failed if f[2] is None]:
                failed = msg_id_missing  # without an id a retry could duplicate: give up
            if msg_id_missing or loop.time() + pause > deadline:
                raise PublishFailed("; ".join(f"{f[0]}: {f[3]}" for f in failed))
            _log.warning("publishes not stored; retrying", service=self.service,
                         count=len(failed), reason=failed[0][3])
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
            inflight = []
            for subject, payload, msg_id, _ in failed:
                try:
                    ack = await self._send(subject, payload, msg_id)
                except Exception as exc:  # still disconnected: counts as failed this round
                    ack = loop.create_future()
                    ack.set_exception(exc)
                inflight.append((subject, payload, msg_id, ack))

    async def subscribe(self, subject: str, handler: Handler, *, durable: str,
                        decoder: Decoder = decode_any, wants: Wants | None = None) -> None:
        sub = Subscription(subject, durable, handler, decoder, wants)

        async def deliver(msg: Any) -> None:
            await self._deliver(sub, msg)

        name = consumer_name(durable, subject)
        stream = self.stream_of(subject)
        start = await self._rewind(stream, name) if self.rewind else None
        # One unacknowledged message at a time: a service handles its messages one by one
        # anyway, and a message handed back for a retry is then not overtaken by the next.
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.EXPLICIT,
                                ack_wait=ACK_WAIT_S, max_deliver=MAX_DELIVER, max_ack_pending=1)
        if start is not None:
            config.deliver_policy, config.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, start
        self._subs.append(await self.js.subscribe(
            self.prefix + subject, durable=name, stream=stream, cb=deliver,
            manual_ack=True, config=config))

    async def _rewind(self, stream: str, name: str) -> int | None:
        """Replace a durable consumer by one that starts after its acknowledgement floor
        (None: there was none)."""
        try:
            info = await self.js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            return None
        await self.js.delete_consumer(stream, name)
        return int(info.ack_floor.stream_seq) + 1

    async def _deliver(self, sub: Subscription, msg: Any) -> None:
        subject = msg.subject[len(self.prefix):]
        fallback = fallback_id((msg.headers or {}).get(MSG_ID), msg.metadata.sequence.stream)
        try:
            env = sub.decoder(msg.data, fallback_id=fallback, now=self.now())
            check_origin(subject, env)  # no operator command as a node status, no node for another
        except Exception as exc:  # any undecodable payload is dead-lettered, then dropped
            self.stats.dead_lettered += 1
            dl = dead_letter_envelope(sub, subject, msg.data, decode_failure(exc), self.now(),
                                      msg.metadata.sequence.stream)
            await self.publish(subjects.deadletter(sub.durable), dl)
            await self.flush()
            await msg.ack()
            return
        if sub.passes_over(env):
            await msg.ack()  # nothing to do with it: as if handled
            return
        self.stats.delivered += 1
        try:
            await self._handle_when_ready(sub, env, msg)
            await self.flush()
        except Exception as exc:
            # The shell dead-letters core failures itself, so this is the shell's own, or a
            # RetryLater that waited too long: redeliver it shortly, and dead-letter it on
            # the last try.
            reason = f"{type(exc).__name__}: {exc}"
            tries = msg.metadata.num_delivered
            if tries < MAX_DELIVER:
                _log.warning("handler failed; redelivering", service=self.service,
                             subject=subject, event_id=env.event_id, reason=reason, tries=tries)
                await msg.nak(delay=RETRY_DELAY_S * tries)
                return
            _log.error("handler failed; dead-lettered", service=self.service, subject=subject,
                       event_id=env.event_id, reason=reason, tries=tries)
            self.stats.dead_lettered += 1
            await self.publish(subjects.deadletter(sub.durable), dead_letter_envelope(
                sub, subject, msg.data, f"{reason} (after {tries} deliveries)", self.now(),
                msg.metadata.sequence.stream))
            await self.flush()
        await msg.ack()

    async def _handle_when_ready(self, sub: Subscription, env: Envelope, msg: Any) -> None:
        """Run the handler; while it answers RetryLater, hold the message (telling JetStream
        it is in progress, so it is neither redelivered nor counted as a delivery) and try
        again with backoff, for up to RETRY_LATER_S. Other subscriptions keep flowing, and
        one of them brings what this message waits for."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETRY_LATER_S
        pause = RETRY_DELAY_S
        while True:
            try:
                await sub.handler(env)
                return
            except RetryLater as exc:
                if loop.time() + pause > deadline:
                    raise RetryLater(f"{exc} (still waiting after {RETRY_LATER_S:g} s)") from exc
                _log.info("handler waits for an earlier input", service=self.service,
                          subject=sub.pattern, event_id=env.event_id, reason=str(exc),
                          retry_in=pause)
            with contextlib.suppress(Exception):  # disconnected: it comes back after ack_wait
                await msg.in_progress()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)

    async def close(self) -> None:
        try:
            await self.flush()
        except PublishFailed as exc:
            _log.error("publishes lost at close", service=self.service, error=str(exc))
        for sub in self._subs:
            await sub.unsubscribe()  # the durable consumers stay: a restart resumes
        self._subs.clear()
        await self.nc.drain()
