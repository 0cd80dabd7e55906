"""A body a core builds with `trusted` is the body validation would build, down to its bytes
on the wire; it refuses names the body lacks and missing required fields at once, and in
check mode (the suite's) anything validation would refuse or change."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import services.runtime.trusted as trusted_module
from domain import causes
from schemas.codec import encode
from schemas.events import (
    TYPE_OF,
    CycleStarted,
    Envelope,
    JobFinished,
    JobTransition,
    Launch,
    NodeCommand,
    NodeStatus,
    PlanDecided,
    Stop,
    envelope,
)
from schemas.job import JobState, SubmitJob
from schemas.status import Status, StatusCode
from services.runtime.trusted import trusted
from tests.builders import make_job

SPEC = make_job("j1").gpus(2).build()
SLOTS = (("n0", (0, 1)),)
LAUNCH = Launch(job_id="j1", spec=SPEC, placement=SLOTS, iterations_done=3.0)
STOP = Stop(job_id="j2", reason="preempted")
DONE = Status(code=StatusCode.REJECTED_BY_POLICY, reason="too wide", decided_by="srtf")

CASES: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (JobTransition, {"job_id": "j1", "state": JobState.RUNNING, "previous": JobState.QUEUED,
                     "cause": causes.STARTED.text, "reason": causes.STARTED, "gpus": 2,
                     "placement": SLOTS, "iterations_done": 0.0, "status": None,
                     "spec": SPEC}),
    (JobTransition, {"job_id": "j1", "state": JobState.REJECTED, "previous": None,
                     "cause": causes.rejected("too wide").text,
                     "reason": causes.rejected("too wide"), "status": DONE}),
    (Launch, {"job_id": "j1", "spec": SPEC, "placement": SLOTS, "iterations_done": 3.0,
              "colocated": ("j1", "j3"), "adaptive_batch": True}),
    (Stop, {"job_id": "j2", "reason": "preempted"}),
    (PlanDecided, {"cycle": 4, "launches": (LAUNCH,), "stops": (STOP,), "running": 1,
                   "busy_gpus": 2, "term": 1}),
    (PlanDecided, {"cycle": 5}),
    (CycleStarted, {"cycle": 6, "trigger": "round"}),
    (NodeCommand, {"node_id": "n0", "cycle": 4, "stops": (STOP,), "launches": (LAUNCH,)}),
    (NodeStatus, {"node_id": "n0", "cycle": 4, "progress": {"j1": 12.5}}),
    (NodeStatus, {"node_id": "n0", "cycle": 4}),
    (JobFinished, {"job_id": "j1", "node_id": "n0", "iterations_done": 100.0}),
    (JobFinished, {"job_id": "j1", "node_id": "n0", "iterations_done": 40.0,
                   "failure": "exit 1", "permanent": True}),
]


def _envelope(body: BaseModel) -> Envelope:
    return envelope(body, event_id="e", occurred_at=1.5, producer="p", causation_id=None)


@pytest.fixture(params=[False, True], ids=["fast", "checked"])
def check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(trusted_module, "CHECK", request.param)
    return bool(request.param)


@pytest.mark.parametrize(("cls", "fields"), CASES)
def test_a_trusted_body_is_the_validated_one(cls: type[BaseModel], fields: dict[str, Any],
                                             check: bool) -> None:
    made, validated = trusted(cls, **fields), cls(**fields)
    assert made == validated
    assert repr(made) == repr(validated)
    assert made.model_fields_set == validated.model_fields_set
    assert made.model_dump() == validated.model_dump()
    if not any(isinstance(v, dict) for v in validated.__dict__.values()):  # else unhashable
        assert hash(made) == hash(validated)
    if cls in TYPE_OF:  # a message of its own, not only a part of one
        assert encode(_envelope(made)) == encode(_envelope(validated))
    with pytest.raises(ValidationError, match="frozen"):
        made.cycle = 9  # type: ignore[attr-defined]  # frozen as any body


def test_a_default_made_by_a_factory_is_made_anew(check: bool) -> None:
    one, two = trusted(NodeStatus, node_id="n0", cycle=1), trusted(NodeStatus, node_id="n0",
                                                                  cycle=1)
    assert one.progress == {} and one.progress is not two.progress


@pytest.mark.parametrize(("fields", "message"), [
    ({"job_id": "j", "reason": "r", "node": "n0"}, "Stop: no field node"),
    ({"job_id": "j"}, "Stop: reason required"),
    ({"job_di": "j", "reason": "r"}, "Stop: no field job_di; job_id required"),
])
def test_a_misnamed_or_missing_field_is_refused_at_once(fields: dict[str, Any], message: str,
                                                        check: bool) -> None:
    with pytest.raises(TypeError, match=f"^{message}$"):
        trusted(Stop, **fields)


@pytest.mark.parametrize(("cls", "fields", "message"), [
    (JobFinished, {"job_id": "j", "node_id": "n0", "iterations_done": 100},
     "field iterations_done is 100 \\(int\\), validated 100.0 \\(float\\)"),
    (PlanDecided, {"cycle": 1, "stops": [STOP]}, "field stops is \\[.*\\(list\\)"),
    (Launch, {"job_id": "j", "spec": SPEC, "placement": (("n0", [0, 1]),)},
     "field placement is"),
])
def test_checked_a_field_validation_would_change_is_refused(
        cls: type[BaseModel], fields: dict[str, Any], message: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trusted_module, "CHECK", True)
    with pytest.raises(TypeError, match=f"^{cls.__name__}: {message}"):
        trusted(cls, **fields)


def test_checked_a_body_validation_refuses_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trusted_module, "CHECK", True)
    with pytest.raises(ValidationError, match="differs from cause"):
        trusted(JobTransition, job_id="j", state=JobState.RUNNING, previous=None,
                cause="not the reason", reason=causes.STARTED)
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        trusted(CycleStarted, cycle=-1, trigger="round")


def test_a_model_with_private_state_is_not_built() -> None:
    with pytest.raises(TypeError, match="SubmitJob has private or extra fields"):
        trusted(SubmitJob, job_id="j")


def test_the_suite_checks_every_trusted_body() -> None:
    assert trusted_module.CHECK  # tests/conftest.py sets LOOM_CHECK_TRUSTED before imports
