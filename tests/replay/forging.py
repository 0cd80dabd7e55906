"""A well-formed but edited event log: one recorded decision changed, so replay diverges."""

from __future__ import annotations

import dataclasses

from loom.eventlog import EventLog
from loom.replay.engine import recorded_envelope
from schemas.codec import encode
from schemas.events import JobTransition


def forge_first_transition(log: EventLog) -> tuple[EventLog, int]:
    """`log` with its first scheduler transition's job id edited, and that record's index."""
    i = next(i for i, r in enumerate(log.records)
             if (e := recorded_envelope(r)) is not None and isinstance(e.body, JobTransition))
    env = recorded_envelope(log.records[i])
    assert env is not None
    forged = env._replace(body=env.body.model_copy(update={"job_id": "forged"}))
    records = list(log.records)
    records[i] = dataclasses.replace(records[i], data=encode(forged))
    return dataclasses.replace(log, records=records), records[i].index
