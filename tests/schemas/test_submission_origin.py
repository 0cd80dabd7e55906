"""A submission made in this process from a spec hands that spec to the scheduler as it is;
one from the wire is validated into a new spec (schemas/job.py, SubmitJob)."""

from __future__ import annotations

import pytest

from schemas.codec import CodecError, decode, decode_submission, encode
from schemas.events import envelope
from schemas.job import SubmitJob
from tests.builders import make_job


def test_an_in_process_submission_hands_over_its_spec_unchecked_and_uncopied() -> None:
    spec = make_job("a").gpus(2).submit(5).build()
    sub = SubmitJob.from_spec(spec)
    assert sub.to_spec("ignored", now=99.0) is spec
    assert sub == SubmitJob(**spec.model_dump())  # the same submission, whatever its origin


def test_an_in_process_submission_is_what_model_construct_builds() -> None:
    """`from_spec` fills pydantic's slots itself (per job, at a million jobs): it must build
    what the public constructor does, field for field, and every field of a spec is one of a
    submission's."""
    spec = make_job("a").gpus(2).submit(5).deadline(900).build()
    assert set(SubmitJob.model_fields) == set(type(spec).model_fields)
    sub = SubmitJob.from_spec(spec)
    built = SubmitJob.model_construct(_fields_set=set(spec.__dict__), **spec.__dict__)
    assert sub.__dict__ == built.__dict__ and sub.__dict__ is not spec.__dict__
    assert sub.model_fields_set == built.model_fields_set
    assert sub.model_extra == built.model_extra
    assert sub.model_dump() == built.model_dump() == spec.model_dump()


def test_a_submission_from_the_wire_is_validated_into_a_new_equal_spec() -> None:
    spec = make_job("a").gpus(2).submit(5).build()
    env = envelope(SubmitJob.from_spec(spec), event_id="e", occurred_at=0.0, producer="p",
                   causation_id=None)
    wire = decode(encode(env)).body
    assert isinstance(wire, SubmitJob)
    got = wire.to_spec("ignored", now=99.0)
    assert got == spec and got is not spec


def test_a_submitter_cannot_smuggle_a_spec_past_validation() -> None:
    """The in-process origin is private: a payload naming it is refused, not trusted."""
    payload = (b'{"model": "resnet18", "gpus": 1, "iterations": 10, "iteration_time_s": 1,'
               b' "_spec": {"job_id": "x", "gpus": 100000}}')
    with pytest.raises(CodecError, match="_spec: not a field Loom knows"):
        decode_submission(payload, fallback_id="f", now=0.0, producer="p")
