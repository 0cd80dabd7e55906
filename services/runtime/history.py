"""Reading a service's history back from the event stream, so a restarted service (a crashed
scheduler, a new leader, a simulated node agent) picks up where it died. What each core reads
and how it rebuilds is its own (`Core.history_subjects`, `Core.rebuild`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas import subjects
from schemas.codec import decode
from services.runtime.effects import Effect
from services.runtime.service import Core, Recorded


async def read_stream(js: Any, subject_filters: Sequence[str], *, stream: str = subjects.STREAM,
                      prefix: str = "", batch: int = 500) -> list[Recorded]:
    """Every decodable message on the given subjects, in stream order (undecodable ones were
    dead-lettered when they arrived and are skipped)."""
    out: list[Recorded] = []
    for subject in subject_filters:
        psub = await js.pull_subscribe(
            prefix + subject, stream=stream,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                                  inactive_threshold=30.0))
        try:
            pending = (await psub.consumer_info()).num_pending  # no waiting on an empty one
            misses = 0
            while pending > 0:
                try:
                    msgs = await psub.fetch(min(batch, pending), timeout=5.0)
                except nats.errors.TimeoutError:
                    misses += 1  # a busy server: a short history would lose jobs, so retry
                    if misses == 5:
                        raise RuntimeError(f"{subject}: {pending} messages of the stream "
                                           "did not arrive; not rebuilding from part of it"
                                           ) from None
                    continue
                pending -= len(msgs)
                for msg in msgs:
                    try:
                        env = decode(msg.data)
                    except Exception:  # dead-lettered when it was delivered
                        continue
                    out.append(Recorded(msg.metadata.sequence.stream,
                                        msg.subject[len(prefix):], env))
                if msgs and msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            await psub.unsubscribe()
    out.sort(key=lambda r: r.seq)
    return out


async def recover(core: Core, bus: Any, now: float) -> list[Effect]:
    """Rebuild `core` from `bus`'s stream before it goes live, and make the bus's durable
    consumers restart at their acknowledgement floor; returns the effects to apply once the
    shell has started. Cores that do not rebuild are left alone."""
    wanted = core.history_subjects()
    if not wanted:
        return []
    bus.rewind = True
    history = await read_stream(bus.js, wanted, stream=bus.stream, prefix=bus.prefix)
    return core.rebuild(history, now)
