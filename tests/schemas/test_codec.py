from __future__ import annotations

import re

import msgpack
import pytest

from domain import causes
from schemas import subjects
from schemas.codec import (
    SUBJECT_TYPES,
    CodecError,
    check_subject,
    decode,
    decode_submission,
    encode,
)
from schemas.events import (
    EVENT_TYPES,
    DeadLetter,
    JobTransition,
    Launch,
    PlanDecided,
    Stop,
    envelope,
)
from schemas.job import JobSpec, JobState, SubmitJob
from schemas.status import Status, StatusCode

SPEC = JobSpec(job_id="j1", model="resnet50", gpus=4, iterations=1000, iteration_time_s=0.25,
               submit_time_s=12.5, stage_times_s=(0.1, 0.1, 0.05), deadline_s=9000.0)
# Heterogeneous and elastic profiles: maps keyed by GPU type and by GPU count (int keys).
PROFILED = SPEC.model_copy(update={
    "job_id": "j2", "job_type": "ResNet-50 (batch size 64)", "weight": 2.0,
    "throughputs": {"v100": 4.0, "k80": 0.6}, "scaling": {1: 1.0, 2: 1.9, 4: 3.5},
    "min_gpus": 1, "max_gpus": 4})

BODIES = [
    SubmitJob.from_spec(SPEC),
    JobTransition(job_id="j1", state=JobState.RUNNING, previous=JobState.QUEUED, cause="started",
                  reason=causes.STARTED, gpus=4, placement=(("n0", (0, 1)), ("n1", (2, 3))),
                  spec=SPEC,
                  status=Status(code=StatusCode.RUNNING, reason="x", decided_by="srtf")),
    PlanDecided(cycle=3, launches=(Launch(job_id="j1", spec=SPEC, placement=(("n0", (0,)),)),
                                   Launch(job_id="j2", spec=PROFILED,
                                          placement=(("n1", (0, 1)),))),
                stops=(Stop(job_id="j2", reason="preempted"),), running=1, busy_gpus=4),
    DeadLetter(subject="loom.jobs.submit", service="scheduler", reason="bad", payload=b"\x00\xff"),
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: type(b).__name__)
def test_roundtrip_preserves_every_field(body) -> None:  # type: ignore[no-untyped-def]
    env = envelope(body, event_id="e-1", occurred_at=42.0, producer="p", causation_id="c-0")
    assert decode(encode(env)) == env


def test_every_event_type_is_versioned() -> None:
    assert all(t.startswith("loom.") and t.rsplit(".", 1)[1].startswith("v") for t in EVENT_TYPES)


def test_each_subject_carries_every_version_of_its_family_and_nothing_else() -> None:
    """SUBJECT_TYPES is derived from EVENT_TYPES: every type travels on exactly one subject,
    every subject carries some type, and a family's versions go together."""
    carried = [t for types in SUBJECT_TYPES.values() for t in types]
    assert sorted(carried) == sorted(EVENT_TYPES)
    assert all(SUBJECT_TYPES.values())
    assert SUBJECT_TYPES[subjects.JOB_TRANSITION] == {"loom.job.transition.v1",
                                                     "loom.job.transition.v2"}
    assert SUBJECT_TYPES[subjects.JOB_SUBMIT] == {"loom.job.submit.v1"}
    with pytest.raises(CodecError, match=re.escape("expected loom.job.transition.v1, "
                                                   "loom.job.transition.v2")):
        check_subject(subjects.JOB_TRANSITION, "loom.job.submit.v1")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb([1, 2]), "must be a map"),
        (msgpack.packb({"type": "loom.nope.v1", "body": {}}), "unknown event type"),
        (msgpack.packb({"type": "loom.job.submit.v1", "event_id": "e", "occurred_at": 0,
                        "producer": "p", "body": {"model": "m", "gpus": -1}}), "gpus"),
        (msgpack.packb({"type": "loom.sched.cycle.v1"}), "unknown event type"),
    ],
    ids=["garbage", "list", "unknown-type", "bad-body", "old-name"],
)
def test_bad_payloads_raise_codec_error_naming_the_problem(payload: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode(payload)


def test_plain_json_submission_gets_the_fallback_id_and_time() -> None:
    env = decode_submission(
        b' {"model": "resnet50", "gpus": 4, "iterations": 100, "iteration_time_s": 0.5}',
        fallback_id="seq-9", now=77.0, producer="nats")
    assert env.event_id == "seq-9" and env.occurred_at == 77.0
    assert isinstance(env.body, SubmitJob)
    spec = env.body.to_spec("job-seq-9", now=77.0)
    assert spec.job_id == "job-seq-9" and spec.submit_time_s == 77.0 and spec.gpus == 4


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"model": "m", "gpus": 4', "invalid JSON at line 1"),
        (b"[1]", "not msgpack|must be a JSON object|must be a map"),
        (b'{"model": "m", "gpus": 4, "iterations": 1, "iteration_time_s": 1, "extra": 1}',
         "extra"),
        (b'{"model": "bad name!", "gpus": 1, "iterations": 1, "iteration_time_s": 1}', "model"),
    ],
    ids=["truncated", "not-object", "unknown-field", "bad-name"],
)
def test_bad_json_submissions_say_what_is_wrong(payload: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode_submission(payload, fallback_id="x", now=0.0, producer="p")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": 0}, "gpus"),
        ({"gpus": 5000}, "gpus"),
        ({"min_gpus": 8}, "min_gpus"),
        ({"max_gpus": 2}, "max_gpus"),
        ({"iteration_time_s": 0}, "iteration_time_s"),
        ({"stage_times_s": (0.1, -1.0)}, "stage_times_s"),
        ({"job_id": "x" * 200}, "job_id"),
    ],
)
def test_jobspec_bounds(fields: dict[str, object], message: str) -> None:
    base = {"job_id": "j", "model": "m", "gpus": 4, "iterations": 10, "iteration_time_s": 1.0,
            "submit_time_s": 0.0}
    with pytest.raises(ValueError, match=message):
        JobSpec(**{**base, **fields})
