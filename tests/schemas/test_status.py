"""`Status.forecast_start_s`: a waiting job's forecast start, readable from old messages and
left off the wire when there is none, so messages without one are what they were."""

from __future__ import annotations

import pytest

from domain import causes
from schemas.codec import decode, encode
from schemas.events import JobTransition, envelope
from schemas.job import JobState
from schemas.status import Status, StatusCode

DONE = Status(code=StatusCode.FINISHED, reason="completed", decided_by="n0")


@pytest.mark.parametrize(("status", "dumped"), [
    (DONE, {"code": "finished", "reason": "completed", "decided_by": "n0",
            "queue_position": None}),
    (Status(code=StatusCode.WAITING_FOR_GPUS, reason="r", decided_by="srtf", queue_position=2,
            forecast_start_s=120.5),
     {"code": "waiting_for_gpus", "reason": "r", "decided_by": "srtf", "queue_position": 2,
      "forecast_start_s": 120.5}),
])
def test_a_status_dumps_its_forecast_only_when_it_has_one(status: Status,
                                                          dumped: dict[str, object]) -> None:
    assert status.model_dump(mode="json") == dumped
    assert Status.model_validate(dumped) == status  # and reads back


def test_a_message_without_a_forecast_is_as_before_and_reads_back() -> None:
    body = JobTransition(job_id="a", state=JobState.FINISHED, previous=JobState.RUNNING,
                         cause="completed", reason=causes.COMPLETED, status=DONE)
    payload = encode(envelope(body, event_id="e1", occurred_at=1.0, producer="scheduler",
                              causation_id=None))
    assert b"forecast_start_s" not in payload
    got = decode(payload).body
    assert isinstance(got, JobTransition) and got.status == DONE
    assert got.status is not None and got.status.forecast_start_s is None
