"""Typed transition causes: what the scheduler writes in version 2, and what a version-1
log's text reads back as."""

from __future__ import annotations

import pytest

from domain import causes
from schemas.causes import Cause
from schemas.codec import decode, encode
from schemas.events import JobTransition, JobTransitionV1, envelope
from schemas.job import JobState

P, F, R, Q, J = (JobState.PREEMPTED, JobState.FAILED, JobState.RUNNING, JobState.QUEUED,
                 JobState.REJECTED)

WRITTEN = [
    (causes.ADMITTED, Q), (causes.STARTED, R), (causes.RESUMED, R), (causes.MIGRATED, R),
    (causes.PREEMPTED, P), (causes.SUSPENDED, P), (causes.CANCELLED, F),
    (causes.COMPLETED, JobState.FINISHED), (causes.COMPLETED_WHILE_REQUEUED, JobState.FINISHED),
    (causes.completed_on_left_node("n3"), JobState.FINISHED), (causes.RECOVERED, R),
    (causes.rejected("needs 9 GPUs; the cluster has 8"), J),
    (causes.requeued("n1", "lost"), P), (causes.requeued("n1", "restarted"), P),
    (causes.retry("n0", "exit 1", 1, 2, 30.0), P),
    (causes.retry("n0", "launch refused on n0: unknown model 'x'", 2, 2, 9.0), P),
    (causes.retry("n0", causes.launch_timeout_failure("n0", 120), 1, 2, 9.0), P),
    (causes.failed("exit 1"), F), (causes.failed(causes.launch_timeout_failure("n0", 5)), F),
]


@pytest.mark.parametrize(("cause", "state"), WRITTEN, ids=lambda c: getattr(c, "text", ""))
def test_a_version_1_log_reads_back_what_version_2_writes(cause: Cause, state: JobState
                                                           ) -> None:
    read = Cause.from_v1(cause.text, state)
    assert (read.kind, read.fault, read.text) == (cause.kind, cause.fault, cause.text)
    if cause.kind in ("requeued", "retry"):
        assert read.node_id == cause.node_id


@pytest.mark.parametrize(("cause", "fault"), [
    (causes.requeued("n1", "lost"), "node-lost"),
    (causes.requeued("n1", "restarted"), "node-restarted"),
    (causes.retry("n0", "exit 1", 1, 2, 30.0), "trainer-failed"),
    (causes.failed("launch refused on n0: no GPU 3"), "launch-refused"),
    (causes.failed(causes.launch_timeout_failure("n0", 5)), "launch-timeout"),
    (causes.COMPLETED, None), (causes.SUSPENDED, None),
])
def test_each_fault_cause_names_its_fault(cause: Cause, fault: str | None) -> None:
    assert cause.fault == fault


def test_both_versions_travel_and_decode_to_their_own_type() -> None:
    why = causes.requeued("n1", "lost")
    v2 = JobTransition(job_id="a", state=P, previous=R, cause=why.text, reason=why)
    v1 = v2.as_v1()
    for body, kind in ((v2, JobTransition), (v1, JobTransitionV1)):
        env = decode(encode(envelope(body, event_id="e1", occurred_at=3.0, producer="t",
                                   causation_id=None)))
        assert type(env.body) is kind and env.body == body
        assert env.body.why().fault == "node-lost"
    assert decode(encode(envelope(v1, event_id="e", occurred_at=0, producer="t",
                                   causation_id=None))).type \
        == "loom.job.transition.v1"


def test_a_reason_whose_text_is_not_the_cause_is_refused() -> None:
    with pytest.raises(ValueError, match="differs from cause"):
        JobTransition(job_id="a", state=P, previous=R, cause="preempted",
                      reason=causes.SUSPENDED)
