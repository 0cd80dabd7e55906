"""policies.REGISTRY and policies.make."""

from __future__ import annotations

import pytest

import policies
from policies.base import Policy

NAMES = sorted(policies.REGISTRY)


def test_registry_holds_the_reproduced_policies() -> None:
    assert {"fifo", "srtf", "srsf", "las", "tiresias"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_entry_is_well_formed(name: str) -> None:
    cls = policies.REGISTRY[name]
    assert issubclass(cls, Policy)
    assert cls.name == name
    assert cls.description.strip() and "\n" not in cls.description
    assert cls.placement in ("consolidated", "count")
    assert cls.replan in ("event", "round", "slot")


@pytest.mark.parametrize("name", NAMES)
def test_make_builds_a_fresh_instance(name: str) -> None:
    a, b = policies.make(name), policies.make(name)
    assert type(a) is policies.REGISTRY[name]
    assert a is not b  # policies keep per-run state (queues); never share one


@pytest.mark.parametrize("bad", ["nope", "", "FIFO", "tiresias "],
                         ids=["unknown", "empty", "wrong-case", "trailing-space"])
def test_make_unknown_name_lists_the_registered_ones(bad: str) -> None:
    with pytest.raises(policies.UnknownPolicy) as exc:
        policies.make(bad)
    assert isinstance(exc.value, KeyError)
    text = str(exc.value)
    assert repr(bad) in text
    for name in NAMES:
        assert name in text
