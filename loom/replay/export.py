"""`loom log export`: a live cluster's JetStream streams, written as one event log file.

The event stream (`LOOM`) and its dead-letter stream (`LOOM_DEADLETTER`, bounded apart from
the history: docs/architecture.md, "Bounded storage") are merged by envelope time, each in
its own order: replay checks a core's dead letters as decisions, so a live run in which a
core refused an input replays only with them. Each record keeps the sequence of its own
stream (the log format allows that in live logs: `loom.eventlog.seq_stream`). A cluster
made before dead letters had their own stream has none to merge: its dead letters are in
the event stream already.

Each stream is read by an ordered consumer from its first message to the last one stored
when the export began (nats-py's ordered consumer re-creates itself on a gap, so the order
holds). The dead-letter stream is read first, whole (it is bounded, 256 MiB by default, and
holds cut copies), then merged into the event stream as that streams by. A record's time
is its envelope's `occurred_at`, the producer's clock; a payload that is not an envelope (a
person's JSON submission) takes the time of the record before it in its stream. The header
holds what the operator says the scheduler ran with: a live stream does not record its
options.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

from loom.eventlog import EventLogWriter, RunInfo
from schemas import subjects
from schemas.codec import decode
from services.runtime.bus import MSG_ID
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_live import with_connection
from services.runtime.stream_limits import deadletter_stream

NEXT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Row:
    """One stored message, as a log record will hold it."""

    seq: int
    subject: str
    time: float
    msg_id: str | None
    data: bytes


def _time(data: bytes, stored: Any, previous: float | None) -> float:
    """The envelope's time; else the record before it (services share one cluster clock,
    which may be time-scaled, so JetStream's wall-clock stamp is only a last resort)."""
    try:
        return decode(data).occurred_at
    except Exception:
        return previous if previous is not None else float(stored.timestamp())


async def merge_by_time(main: AsyncIterator[Row], side: Iterable[Row]) -> AsyncIterator[Row]:
    """`main` and `side` as one sequence ordered by time where they interleave, each in its
    own order (as heapq.merge); on a tie `main` comes first: a dead letter is published
    after the input it refuses."""
    rest = iter(side)
    waiting = next(rest, None)
    async for row in main:
        while waiting is not None and waiting.time < row.time:
            yield waiting
            waiting = next(rest, None)
        yield row
    while waiting is not None:
        yield waiting
        waiting = next(rest, None)


async def export_stream(url: str, stream: str, out: Path, run: RunInfo,
                        prefix: str = "", auth: NatsAuth | None = None) -> int:
    """Write every message of `stream` and its dead-letter stream to `out`; returns how
    many. `auth`: credentials and TLS files (reading a stream needs a user that may create
    consumers on it)."""
    return await with_connection(url, auth, lambda nc: _export(nc, stream, out, run, prefix))


async def _export(nc: Any, stream: str, out: Path, run: RunInfo, prefix: str) -> int:
    writer: EventLogWriter | None = None
    done = False
    try:
        js = nc.jetstream()
        state = (await js.stream_info(stream)).state
        dead = [row async for row in _dead_letters(js, stream, prefix)]
        # The exporter is not the scheduler: its versions would say nothing of the run's.
        writer = EventLogWriter(out, "live", run, versions=None)
        async for row in merge_by_time(_rows(js, stream, prefix, state), dead):
            writer.record(row.seq, row.subject, row.time, row.msg_id, row.data)
        done = True
        return writer.count
    finally:
        if writer is not None:
            writer.close(None, complete=done)


async def _dead_letters(js: Any, stream: str, prefix: str) -> AsyncIterator[Row]:
    """The dead-letter stream's rows; none where it does not exist (an older cluster)."""
    name = deadletter_stream(stream)
    try:
        state = (await js.stream_info(name)).state
    except nats.js.errors.NotFoundError:
        return
    async for row in _rows(js, name, prefix, state):
        yield row


async def _rows(js: Any, stream: str, prefix: str, state: Any) -> AsyncIterator[Row]:
    """The messages of `stream` up to `state`'s last sequence, in stream order."""
    if not state.messages:
        return
    last = state.last_seq
    sub = await js.subscribe(prefix + subjects.EVERY_SUBJECT, stream=stream, ordered_consumer=True,
                             config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
    previous: float | None = None
    try:
        while True:
            msg = await sub.next_msg(timeout=NEXT_TIMEOUT_S)
            meta = msg.metadata
            previous = _time(msg.data, meta.timestamp, previous)
            yield Row(meta.sequence.stream, msg.subject[len(prefix):], previous,
                      (msg.headers or {}).get(MSG_ID), msg.data)
            if meta.sequence.stream >= last:
                break
    finally:
        await sub.unsubscribe()
