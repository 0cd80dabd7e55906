"""Effects are values: their written constructors keep the defaults and the freezing that a
generated one gave, compiled or from source."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schemas.job import JobState
from schemas.status import Status, StatusCode
from services.runtime.effects import PRIORITY_CYCLE, PRIORITY_INPUT, CancelTimer, Publish, SetTimer

BODY = Status(code=StatusCode.WAITING_FOR_GPUS, reason="r", decided_by="t")

CASES: list[tuple[Any, dict[str, Any]]] = [
    (Publish("a.b", BODY), {"subject": "a.b", "body": BODY, "event_id": None, "producer": None}),
    (Publish("a.b", BODY, event_id="e1", producer="p"),
     {"subject": "a.b", "body": BODY, "event_id": "e1", "producer": "p"}),
    (SetTimer("k", 2.5), {"key": "k", "at": 2.5, "priority": PRIORITY_INPUT, "order": None}),
    (SetTimer(key=("n", 1), at=1.0, priority=PRIORITY_CYCLE, order=3),
     {"key": ("n", 1), "at": 1.0, "priority": PRIORITY_CYCLE, "order": 3}),
    (CancelTimer(key=JobState.QUEUED), {"key": JobState.QUEUED}),
]


@pytest.mark.parametrize(("effect", "fields"), CASES)
def test_an_effect_holds_what_it_was_given_and_its_defaults(effect: Any,
                                                            fields: dict[str, Any]) -> None:
    assert dataclasses.asdict(effect) == fields
    assert effect == type(effect)(**fields)
    assert dataclasses.replace(effect) == effect


@pytest.mark.parametrize(("effect", "fields"), CASES)
def test_an_effect_cannot_be_changed(effect: Any, fields: dict[str, Any]) -> None:
    name = next(iter(fields))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(effect, name, fields[name])


def test_an_effect_is_hashable_as_a_value() -> None:
    assert hash(SetTimer("k", 1.0)) == hash(SetTimer("k", 1.0))
    assert SetTimer("k", 1.0) != SetTimer("k", 1.0, order=0)
