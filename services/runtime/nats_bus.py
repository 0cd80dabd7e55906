"""The virtual-time bus over real NATS JetStream.

Every message is msgpack-encoded and published to one stream with its `event_id` as
`Nats-Msg-Id` (JetStream drops duplicates). Virtual time still comes from the kernel: a
delivery is scheduled at the publish instant, and when its turn comes the bus takes the next
message off the stream and hands it to the subscribers. Same kernel, same order, same decisions
as `MemoryBus`, with the wire in between.

All services of a simulation live in this process, so the bus reads the stream once, through
one durable consumer in stream order, decodes each message once and dispatches it locally
(a live deployment gives each service its own durable consumer instead). One connection
keeps publish order, so the message read is always the one the kernel expects; the bus checks
that by id and fails loudly if not.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections import deque
from functools import partial
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
    Route,
    Routes,
    Subscription,
    Wants,
    dead_letter_envelope,
    decode_any,
    decode_failure,
    fallback_id,
)
from services.runtime.effects import PRIORITY_INPUT
from services.runtime.kernel import SimKernel
from services.runtime.logging import get_logger
from services.runtime.natsserver import EmbeddedNats
from services.runtime.stream_limits import DUPLICATE_WINDOW_S

NEXT_TIMEOUT_S = 30.0
# Handled messages are acked in batches (AckPolicy.ALL: one ack covers all earlier ones).
ACK_EVERY = 64
ACK_WAIT_S = 3600.0
SHARED_STREAM_MAX_AGE_S = 24 * 3600.0


_log = get_logger("loom.bus")


async def _log_client_error(exc: Exception) -> None:
    """nats-py reports connection trouble here (its default prints tracebacks)."""
    _log.warning("nats client error", error=f"{type(exc).__name__}: {exc}")


class BusDesync(RuntimeError):
    """The stream returned a different message than the kernel expected: a bug, not input."""


class NatsSimBus:
    def __init__(
        self, kernel: SimKernel, nc: Any, *, stream: str, prefix: str, run_id: str,
        server: EmbeddedNats | None = None,
    ) -> None:
        self.kernel = kernel
        self.nc = nc
        self.js = nc.jetstream()
        self.stream = stream
        self.prefix = prefix
        self.run_id = run_id
        self.server = server
        self.stats = BusStats()
        self._routes = Routes()
        self._seen: set[str] = set()
        self._reader: Any = None
        self._unacked = 0
        self._last: Any = None
        self._inbox: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None

    @classmethod
    async def open(
        cls, kernel: SimKernel, url: str | None = None, *, run_id: str = "sim"
    ) -> NatsSimBus:
        """Connect to `url`, or start a private server when it is None.

        On a private server the run owns the whole `LOOM` stream. On a shared server it gets
        its own stream and subject prefix so runs never see each other's messages.
        """
        # Unique per run: re-running the same policy and seed must not collide with (and be
        # de-duplicated against) an earlier run's stream on the same server.
        token = f"{re.sub(r'[^A-Za-z0-9_-]', '_', run_id)}_{secrets.token_hex(4)}"
        server = None
        if url is None:
            server = await EmbeddedNats.start()
            url = server.url
            stream, prefix = subjects.STREAM, ""
        else:
            stream, prefix = f"LOOMSIM_{token}", f"sim.{token}."
        nc = await nats.connect(url, max_reconnect_attempts=3, connect_timeout=5,
                                error_cb=_log_client_error)
        bus = cls(kernel, nc, stream=stream, prefix=prefix, run_id=token, server=server)
        await bus._ensure_stream()
        return bus

    async def _ensure_stream(self) -> None:
        # On a shared server a simulation's stream is kept for a day (to inspect or export),
        # then expires; a private server's store is deleted with the server anyway.
        max_age = SHARED_STREAM_MAX_AGE_S if self.server is None else None
        cfg = StreamConfig(
            name=self.stream, subjects=[self.prefix + subjects.EVERY_SUBJECT],
            duplicate_window=DUPLICATE_WINDOW_S, max_age=max_age,
        )
        try:
            await self.js.add_stream(cfg)
        except nats.js.errors.BadRequestError:
            await self.js.update_stream(cfg)
        self._reader = await self.js.subscribe(
            self.prefix + subjects.EVERY_SUBJECT,
            durable=f"sim-{self.run_id}",
            stream=self.stream,
            cb=self._arrived,
            manual_ack=True,
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.NEW,
                ack_policy=AckPolicy.ALL,
                ack_wait=ACK_WAIT_S,
                max_ack_pending=-1,
            ),
        )

    # -- publishing ------------------------------------------------------------------------
    async def publish(self, subject: str, env: Envelope) -> bool:
        return await self._publish(subject, encode(env), env.event_id)

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None = None) -> bool:
        return await self._publish(subject, payload, msg_id)

    async def _publish(self, subject: str, payload: bytes, msg_id: str | None) -> bool:
        if not subject.startswith("loom."):
            raise ValueError(f"subject {subject!r} is outside the run's stream "
                             f"({subjects.EVERY_SUBJECT})")
        headers = None if msg_id is None else {MSG_ID: msg_id}
        # A plain publish into the stream's subjects is stored by JetStream; reading it back
        # through the consumer below is the proof it was stored, so no PubAck round trip.
        await self.nc.publish(self.prefix + subject, payload, headers=headers)
        if msg_id is not None:
            if msg_id in self._seen:
                self.stats.duplicates += 1  # JetStream drops it within its window; so do we
                return False
            self._seen.add(msg_id)
        self.stats.published += 1
        route = self._routes.match(subject)
        self.kernel.push(self.kernel.now, PRIORITY_INPUT,
                         partial(self._deliver, route, subject, msg_id))
        return True

    # -- delivery --------------------------------------------------------------------------
    async def _arrived(self, msg: Any) -> None:
        self._inbox.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _next(self) -> Any:
        # Most messages are already here; waiting (and its timer) only when one is in flight.
        while not self._inbox:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, NEXT_TIMEOUT_S)
            except TimeoutError:
                raise BusDesync(f"no message from the stream in {NEXT_TIMEOUT_S}s") from None
            finally:
                self._waiter = None
        return self._inbox.popleft()

    async def _deliver(self, route: Route, subject: str, msg_id: str | None) -> None:
        msg = await self._next()
        got = (msg.headers or {}).get(MSG_ID)
        if msg_id is not None and got != msg_id:
            raise BusDesync(f"expected {msg_id} on {subject}, the stream gave {got}")
        fallback = fallback_id(got, msg.metadata.sequence.stream)
        decoded: dict[int, Envelope] = {}
        for sub in route.targets():
            key = id(sub.decoder)
            env = decoded.get(key)
            if env is None:
                try:
                    env = sub.decoder(msg.data, fallback_id=fallback, now=self.kernel.now)
                except Exception as exc:  # any undecodable payload is dead-lettered
                    self.stats.dead_lettered += 1
                    dl = dead_letter_envelope(
                        sub, subject, msg.data, decode_failure(exc), self.kernel.now,
                        self.stats.dead_lettered,
                    )
                    await self.publish(subjects.deadletter(sub.durable), dl)
                    continue
                decoded[key] = env
            if sub.passes_over(env):
                continue
            self.stats.delivered += 1
            await sub.handler(env)
        self._unacked += 1
        self._last = msg
        if self._unacked >= ACK_EVERY:
            await msg.ack()
            self._unacked = 0

    async def subscribe(
        self, subject: str, handler: Handler, *, durable: str, decoder: Decoder = decode_any,
        wants: Wants | None = None,
    ) -> None:
        self._routes.add(Subscription(subject, durable, handler, decoder, wants))

    async def flush(self) -> None:
        return None  # reading the message back through the consumer proves it was stored

    async def close(self) -> None:
        try:
            if self._unacked and self._last is not None:
                await self._last.ack_sync()
            if self._reader is not None:
                await self._reader.unsubscribe()
            await asyncio.wait_for(self.nc.drain(), timeout=10)
        finally:
            if self.server is not None:
                await self.server.stop()
