"""A Bus that records every message it carries, then hands it to the bus it wraps.

Both simulation buses deliver messages in publish order (timers interleave, messages never
overtake each other), so recording at publish is recording in delivery order. Each record
carries the payload as on the wire (msgpack envelope, or the raw bytes a person published)
and the sequence the stream gives it: the wrapped bus's count of stored messages, so
`fallback_id` for a raw submission comes out the same on replay. Duplicates the bus drops
are not recorded; nor are dead letters a bus publishes itself (a gap in the sequence).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from schemas.codec import encode
from schemas.events import Envelope
from services.runtime.bus import Bus, BusStats, Decoder, Handler, Wants, decode_any


class RecordSink(Protocol):
    def record(self, seq: int, subject: str, time: float, msg_id: str | None,
               data: bytes) -> None: ...


class RecordingBus:
    def __init__(self, inner: Bus, sink: RecordSink, now: Callable[[], float]) -> None:
        self.inner = inner
        self.sink = sink
        self.now = now
        self.stats: BusStats = inner.stats  # the same object: counts are the wrapped bus's

    async def publish(self, subject: str, env: Envelope) -> bool:
        stored = await self.inner.publish(subject, env)
        if stored:
            self.sink.record(self.inner.stats.published, subject, self.now(), env.event_id,
                             encode(env))
        return stored

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None = None) -> bool:
        stored = await self.inner.publish_raw(subject, payload, msg_id)
        if stored:
            self.sink.record(self.inner.stats.published, subject, self.now(), msg_id, payload)
        return stored

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
