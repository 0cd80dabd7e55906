"""`JobSpec.fail_at`: the failures a trace records, as progress marks. Checked where a job is
built and where it travels; absent, a spec is exactly what it was."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.codec import CodecError, decode_submission
from schemas.job import MAX_FAIL_MARKS, JobSpec, SubmitJob
from tests.builders import make_job

BASE = {"model": "resnet18", "gpus": 1, "iterations": 100, "iteration_time_s": 1.0}


@pytest.mark.parametrize("marks", [(100.0,), (0.5,), (10.0, 50.5, 100.0), (99.0,),
                                   tuple(float(i) for i in range(1, 101))])
def test_good_marks_are_kept(marks: tuple[float, ...]) -> None:
    assert make_job("a").build().model_copy(update={"fail_at": None}).fail_at is None
    assert JobSpec(**BASE, job_id="a", submit_time_s=0.0, fail_at=marks).fail_at == marks


@pytest.mark.parametrize(("marks", "message"), [
    ([], "fail_at needs at least one mark"),
    ([0], r"fail_at\.0: got 0; allowed: a number greater than 0"),
    ([-5, 10], r"fail_at\.0: got -5"),
    ([10, 5], r"fail_at must be strictly increasing \(5 follows 10\)"),
    ([10, 10], r"fail_at must be strictly increasing \(10 follows 10\)"),
    ([50, 101], r"fail_at: mark 101 is past the job's iterations \(100\)"),
    (["x"], r"fail_at\.0: got \"x\"; allowed: a number"),
    ([1] * (MAX_FAIL_MARKS + 1), f"fail_at: .*allowed: at most {MAX_FAIL_MARKS} items"),
], ids=["empty", "zero", "negative", "decreasing", "repeated", "past-the-end", "text",
        "too-many"])
def test_bad_marks_are_refused_naming_the_field(marks: list[Any], message: str) -> None:
    payload = json.dumps({**BASE, "fail_at": marks}).encode()
    with pytest.raises(CodecError, match=message):
        decode_submission(payload, fallback_id="x", now=0.0, producer="t")
    with pytest.raises(ValidationError, match="fail_at"):
        SubmitJob.model_validate({**BASE, "fail_at": marks}).to_spec("a", 0.0)


def test_a_spec_without_marks_serialises_as_before() -> None:
    spec = make_job("a").build()
    assert "fail_at" not in spec.model_dump_json(exclude_defaults=True)
    assert spec.fail_at is None


@pytest.mark.parametrize("marks", [(100.0,), (1 / 3, 2 / 3, 100.0), (12.345678901234567,)])
def test_marks_survive_the_json_round_trip(marks: tuple[float, ...]) -> None:
    spec = JobSpec(**BASE, job_id="a", submit_time_s=0.0, fail_at=marks)
    back = JobSpec.model_validate_json(spec.model_dump_json(exclude_defaults=True))
    assert back == spec and back.fail_at == marks
    sub = decode_submission(json.dumps({**BASE, "fail_at": list(marks)}).encode(),
                            fallback_id="x", now=0.0, producer="t").body
    assert isinstance(sub, SubmitJob) and sub.to_spec("a", 0.0) == spec
