"""The decoders against hostile input, without a server: they refuse with a CodecError that
says what is wrong, and nothing else ever escapes them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import subjects
from schemas.codec import (
    MAX_EVENT_BYTES,
    MAX_SUBMISSION_BYTES,
    CodecError,
    check_subject,
    decode,
    decode_submission,
)
from schemas.job import MAX_GPUS, MAX_ITERATIONS, MAX_NAME, MAX_SECONDS, MAX_STAGES, SubmitJob
from tests.fuzz.payloads import (
    GOOD_JOB,
    SAMPLE_BODIES,
    decoder_for,
    deep,
    edge_cases,
    nested,
    pack,
    sample_dict,
    truncated,
    wrong_type,
)

SUBJECTS = sorted(SAMPLE_BODIES)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(subject: str, payload: bytes) -> str | None:
    """None if accepted, else the refusal's message; any other exception fails the test."""
    try:
        env = decoder_for(subject)(payload)
        check_subject(subject, env.type)
    except CodecError as exc:
        assert str(exc), "a refusal must say why"
        assert len(str(exc)) < 2000, "a hostile payload must not blow up the reason"
        return str(exc)
    return None


@FAST
@given(subject=st.sampled_from(SUBJECTS), payload=st.binary(max_size=2048))
def test_random_bytes_raise_only_codec_errors(subject: str, payload: bytes) -> None:
    outcome(subject, payload)


@FAST
@given(payload=st.text(max_size=512).map(lambda t: ("{" + t).encode()))
def test_json_looking_text_raises_only_codec_errors(payload: bytes) -> None:
    outcome(subjects.JOB_SUBMIT, payload)


@FAST
@given(data=st.data(), subject=st.sampled_from(SUBJECTS))
def test_truncated_wrong_typed_and_deep_payloads_are_refused(data: st.DataObject,
                                                              subject: str) -> None:
    family = data.draw(st.sampled_from([truncated, wrong_type, deep]))
    payload = data.draw(family(subject))
    assert outcome(subject, payload) is not None


@pytest.mark.parametrize("subject", SUBJECTS)
def test_each_subject_accepts_its_own_sample(subject: str) -> None:
    assert outcome(subject, pack(sample_dict(subject))) is None


@pytest.mark.parametrize("subject", SUBJECTS)
def test_each_edge_case_is_refused(subject: str) -> None:
    cases = edge_cases(subject)
    assert [i for i, p in enumerate(cases) if outcome(subject, p) is None] == []


def job(**change: Any) -> bytes:
    return json.dumps({**GOOD_JOB, **change}).encode()


@pytest.mark.parametrize(("payload", "names"), [
    (job(gpus=MAX_GPUS + 1), ["gpus", str(MAX_GPUS)]),
    (job(iterations=MAX_ITERATIONS + 1), ["iterations", "1000000000000"]),
    (job(iteration_time_s=MAX_SECONDS * 2), ["iteration_time_s", "1000000000000"]),
    (job(deadline_s=1e300), ["deadline_s"]),
    (job(model="m" * (MAX_NAME + 1)), ["model", str(MAX_NAME)]),
    (job(tenant="bad tenant!"), ["tenant", "bad tenant!", "allowed: letters, digits"]),
    (job(stage_times_s=[0.1] * (MAX_STAGES + 1)), ["stage_times_s", str(MAX_STAGES)]),
    (job(throughputs={f"t{i}": 1.0 for i in range(65)}), ["throughputs", "64"]),
    (job(scaling={"5000": 1.0}), ["scaling", str(MAX_GPUS)]),
    (job(priority=10**7), ["priority"]),
    (job(weight=1e9), ["weight"]),
    (job(batch_size=2**30), ["batch_size"]),
    (b'{"model": "m", "gpus": NaN}', ["NaN"]),
    (b'{"model": "m", "gpus": ' + b"9" * 5000 + b"}", ["invalid JSON"]),
    (job(job_type="x" * MAX_SUBMISSION_BYTES), ["exceeds the limit", str(MAX_SUBMISSION_BYTES)]),
    (b'{"a":' + b"[" * 3000 + b"1" + b"]" * 3000 + b"}", ["nested"]),
    (json.dumps({**GOOD_JOB, "goodput": {"epochs": [[[[[[[[[[[[[1]]]]]]]]]]]]]}}).encode(),
     ["nested deeper than"]),
    (pack(sample_dict(subjects.OPERATOR)), ["loom.ops.command.v1", "loom.jobs.submit"]),
    (b"", ["empty payload"]),
], ids=["gpus", "iterations", "iteration-time", "deadline", "model-length", "tenant-chars",
        "stages", "gpu-types", "scaling-key", "priority", "weight", "batch", "nan",
        "huge-int", "oversized", "json-depth", "depth", "wrong-type", "empty"])
def test_submission_refusals_name_the_field_and_the_bound(payload: bytes,
                                                          names: list[str]) -> None:
    reason = outcome(subjects.JOB_SUBMIT, payload)
    assert reason is not None
    for name in names:
        assert name in reason, reason


def test_internal_events_have_their_own_size_limit() -> None:
    data = sample_dict(subjects.NODE_STATUS)
    data["body"]["node_id"] = "n" * MAX_EVENT_BYTES
    with pytest.raises(CodecError, match=f"exceeds the limit of {MAX_EVENT_BYTES}"):
        decode(pack(data))


def test_a_non_finite_event_time_is_refused() -> None:
    data = sample_dict(subjects.NODE_STATUS)
    data["occurred_at"] = float("nan")
    with pytest.raises(CodecError, match="occurred_at must be finite"):
        decode(pack(data))


def test_a_submission_at_every_bound_is_accepted() -> None:
    edge = SubmitJob.model_validate({
        **GOOD_JOB, "gpus": MAX_GPUS, "iterations": MAX_ITERATIONS,
        "iteration_time_s": MAX_SECONDS, "model": "m" * MAX_NAME,
        "stage_times_s": [1.0] * MAX_STAGES, "scaling": {MAX_GPUS: 1.0}})
    payload = json.dumps(edge.model_dump(exclude_none=True)).encode()
    env = decode_submission(payload, fallback_id="x", now=0.0, producer="t")
    assert env.body == edge


def test_nesting_just_under_the_limit_is_only_refused_by_the_schema() -> None:
    data = sample_dict(subjects.NODE_STATUS)
    data["body"]["extra"] = nested(3)
    with pytest.raises(CodecError, match="extra"):
        decode(pack(data))
