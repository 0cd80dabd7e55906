"""`loom log export`: a live JetStream stream, written as an event log file.

An ordered consumer reads the stream from its first message to the last one stored when the
export began (nats-py's ordered consumer re-creates itself on a gap, so the order holds). A
record's time is its envelope's `occurred_at`, the producer's clock; a payload that is not an
envelope (a person's JSON submission) takes the time of the record before it. The header holds
what the operator says the scheduler ran with: a live stream does not record its options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy

from loom.eventlog import EventLogWriter, RunInfo
from schemas.codec import decode
from services.runtime.bus import MSG_ID
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_live import with_connection

NEXT_TIMEOUT_S = 5.0


def _time(data: bytes, stored: Any, previous: float | None) -> float:
    """The envelope's time; else the record before it (services share one cluster clock,
    which may be time-scaled, so JetStream's wall-clock stamp is only a last resort)."""
    try:
        return decode(data).occurred_at
    except Exception:
        return previous if previous is not None else float(stored.timestamp())


async def export_stream(url: str, stream: str, out: Path, run: RunInfo,
                        prefix: str = "", auth: NatsAuth | None = None) -> int:
    """Write every message of `stream` to `out`; returns how many. `auth`: credentials and
    TLS files (reading a stream needs a user that may create consumers on it)."""
    return await with_connection(url, auth, lambda nc: _export(nc, stream, out, run, prefix))


async def _export(nc: Any, stream: str, out: Path, run: RunInfo, prefix: str) -> int:
    writer: EventLogWriter | None = None
    done = False
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        last = info.state.last_seq
        # The exporter is not the scheduler: its versions would say nothing of the run's.
        writer = EventLogWriter(out, "live", run, versions=None)
        if info.state.messages:
            sub = await js.subscribe(
                f"{prefix}loom.>", stream=stream, ordered_consumer=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
            previous: float | None = None
            try:
                while True:
                    msg = await sub.next_msg(timeout=NEXT_TIMEOUT_S)
                    meta = msg.metadata
                    previous = _time(msg.data, meta.timestamp, previous)
                    writer.record(meta.sequence.stream, msg.subject[len(prefix):], previous,
                                  (msg.headers or {}).get(MSG_ID), msg.data)
                    if meta.sequence.stream >= last:
                        break
            finally:
                await sub.unsubscribe()
        done = True
        return writer.count
    finally:
        if writer is not None:
            writer.close(None, complete=done)
