"""The live bus: one service per process, JetStream in between, wall-clock time.

Unlike the simulation's bus, nothing orders deliveries across services: each subscription is
a durable JetStream consumer of its own, named after the service and subject, so a service
that restarts resumes after the last message it acknowledged. A message is acknowledged once
its handler has returned and everything the handler published is stored (at-least-once); a
handler that raises, or whose publishes JetStream does not acknowledge, leaves it
unacknowledged, and JetStream redelivers it up to MAX_DELIVER times.

Publishes are pipelined: each is sent at once, in order on one connection, with the
envelope's `event_id` as `Nats-Msg-Id` (JetStream drops a duplicate within its window), and
the acknowledgements are awaited together (`flush`): one round trip for a cycle's plan and
transitions instead of one each. A payload no decoder accepts is dead-lettered on
`loom.deadletter.<service>` with the reason, then acknowledged.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from schemas import subjects
from schemas.codec import encode
from schemas.events import Envelope
from services.runtime.bus import (
    MSG_ID,
    BusStats,
    Decoder,
    Handler,
    Subscription,
    dead_letter_envelope,
    decode_any,
    decode_failure,
    fallback_id,
)
from services.runtime.logging import get_logger

DUPLICATE_WINDOW_S = 600.0
MAX_DELIVER = 5
ACK_WAIT_S = 60.0

_log = get_logger("loom.bus")


def consumer_name(service: str, subject: str) -> str:
    """A durable name per (service, subject): JetStream names allow no '.', '*' or '>'."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", service)
    return f"{safe}-{hashlib.sha1(subject.encode()).hexdigest()[:10]}"


async def ensure_stream(js: Any, stream: str = subjects.STREAM, prefix: str = "",
                        replicas: int = 1) -> None:
    """Create the cluster's stream (`loom.>`, file storage; `replicas` copies on a NATS
    cluster) or leave an existing one as it is."""
    cfg = StreamConfig(name=stream, subjects=[f"{prefix}loom.>"],
                       duplicate_window=DUPLICATE_WINDOW_S, num_replicas=replicas)
    try:
        await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        await js.add_stream(cfg)


class PublishFailed(RuntimeError):
    """JetStream did not acknowledge (store) a publish."""


def server_list(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` → the servers a client may connect to."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise ValueError("--nats-url is empty")
    return servers


class NatsLiveBus:
    def __init__(self, nc: Any, *, service: str, now: Callable[[], float],
                 stream: str = subjects.STREAM, prefix: str = "") -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.service = service
        self.now = now
        self.stream = stream
        self.prefix = prefix
        self.stats = BusStats()
        self._subs: list[Any] = []
        self._inflight: list[tuple[str, asyncio.Future[Any]]] = []

    @classmethod
    async def connect(cls, url: str, *, service: str, now: Callable[[], float],
                      stream: str = subjects.STREAM, prefix: str = "",
                      replicas: int = 1) -> NatsLiveBus:
        """`url` may list several servers of a NATS cluster, comma-separated."""
        async def error(exc: Exception) -> None:
            _log.warning("nats client error", service=service,
                         error=f"{type(exc).__name__}: {exc}")

        nc = await nats.connect(servers=server_list(url), name=f"loom-{service}",
                                error_cb=error, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.5)
        bus = cls(nc, service=service, now=now, stream=stream, prefix=prefix)
        await ensure_stream(bus.js, stream, prefix, replicas)
        return bus

    async def publish(self, subject: str, env: Envelope) -> bool:
        return await self.publish_raw(subject, encode(env), env.event_id)

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None = None) -> bool:
        """Send now; the acknowledgement is awaited by `flush` (True: sent)."""
        if not subject.startswith("loom."):
            raise ValueError(f"subject {subject!r} is outside the cluster's stream (loom.>)")
        headers = None if msg_id is None else {MSG_ID: msg_id}
        ack = await self.js.publish_async(self.prefix + subject, payload, headers=headers,
                                          stream=self.stream)
        self._inflight.append((subject, ack))
        self.stats.published += 1
        return True

    async def flush(self) -> None:
        """Wait until JetStream has stored everything published so far; raise if it has not."""
        inflight, self._inflight = self._inflight, []
        failed = []
        for subject, ack in inflight:
            try:
                if (await ack).duplicate:
                    self.stats.duplicates += 1  # dropped by JetStream: already in the stream
                    self.stats.published -= 1
            except Exception as exc:  # not stored: the caller must not treat it as sent
                failed.append(f"{subject}: {type(exc).__name__}: {exc}")
        if failed:
            raise PublishFailed("; ".join(failed))

    async def subscribe(self, subject: str, handler: Handler, *, durable: str,
                        decoder: Decoder = decode_any) -> None:
        sub = Subscription(subject, durable, handler, decoder)

        async def deliver(msg: Any) -> None:
            await self._deliver(sub, msg)

        self._subs.append(await self.js.subscribe(
            self.prefix + subject, durable=consumer_name(durable, subject), stream=self.stream,
            cb=deliver, manual_ack=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL,
                                  ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S,
                                  max_deliver=MAX_DELIVER)))

    async def _deliver(self, sub: Subscription, msg: Any) -> None:
        subject = msg.subject[len(self.prefix):]
        fallback = fallback_id((msg.headers or {}).get(MSG_ID), msg.metadata.sequence.stream)
        try:
            env = sub.decoder(msg.data, fallback_id=fallback, now=self.now())
        except Exception as exc:  # any undecodable payload is dead-lettered, then dropped
            self.stats.dead_lettered += 1
            dl = dead_letter_envelope(sub, subject, msg.data, decode_failure(exc), self.now(),
                                      msg.metadata.sequence.stream)
            await self.publish(subjects.deadletter(sub.durable), dl)
            await self.flush()
            await msg.ack()
            return
        self.stats.delivered += 1
        try:
            await sub.handler(env)
            await self.flush()
        except Exception:
            # Left unacknowledged: JetStream redelivers it after ack_wait (at most MAX_DELIVER
            # times). The shell dead-letters core failures itself, so this is the shell's own.
            _log.exception("handler failed", service=self.service, subject=subject,
                           event_id=env.event_id)
            return
        await msg.ack()

    async def close(self) -> None:
        try:
            await self.flush()
        except PublishFailed as exc:
            _log.error("publishes lost at close", service=self.service, error=str(exc))
        for sub in self._subs:
            await sub.unsubscribe()  # the durable consumers stay: a restart resumes
        self._subs.clear()
        await self.nc.drain()
