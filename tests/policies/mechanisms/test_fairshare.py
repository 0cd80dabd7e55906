"""Decayed usage (fair share over time): the formula, its independence from how often it is
brought up to date, the order it gives, Slurm's factor, and how the queue layer charges it."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest

from domain.placement import CyclePlacement
from policies.base import JobView, Snapshot
from policies.mechanisms.fairshare import Usage, accrue, factors, order_key
from policies.mechanisms.queue_layer import QueueLayer
from tests.builders import cluster
from tests.policies.mechanisms.queue_fixtures import ones, queues

H = 3600.0


@pytest.mark.parametrize(("usage", "gpus", "dt", "expected"), [
    (100.0, 0.0, H, 50.0),  # nothing held: halves every half-life
    (100.0, 0.0, 2 * H, 25.0),
    (0.0, 4.0, H, 4.0 * H / math.log(2) * 0.5),  # the integral of 4 GPUs decaying
    (0.0, 4.0, 0.0, 0.0),
    (10.0, 2.0, -5.0, 10.0),  # time never runs backwards
])
def test_accrue(usage: float, gpus: float, dt: float, expected: float) -> None:
    assert accrue(usage, gpus, dt, H) == pytest.approx(expected)


def test_holding_for_ever_tends_to_gpus_times_half_life_over_ln2() -> None:
    assert accrue(0.0, 8.0, 1000 * H, H) == pytest.approx(8.0 * H / math.log(2))


def test_no_half_life_is_plain_gpu_seconds() -> None:
    assert accrue(5.0, 2.0, 10.0, math.inf) == 25.0


def test_two_half_steps_make_one_step() -> None:
    once = Usage(0.0, MappingProxyType({"a": 50.0})).advance(1000.0, {"a": 3}, {"a": H})
    twice = Usage(0.0, MappingProxyType({"a": 50.0})).advance(400.0, {"a": 3}, {"a": H}) \
        .advance(1000.0, {"a": 3}, {"a": H})
    assert twice.of("a") == pytest.approx(once.of("a"), rel=1e-12)


def test_first_advance_starts_the_clock() -> None:
    usage = Usage().advance(50.0, {"a": 4, "b": 0}, {"a": H, "b": H})
    assert usage.at == 50.0 and dict(usage.gpu_s) == {"a": 0.0}


def test_order_priority_then_usage_per_weight_then_name() -> None:
    keys = {q: order_key(q, u, w, p) for q, u, w, p in [
        ("a", 100.0, 1.0, 0), ("b", 150.0, 2.0, 0), ("c", 900.0, 1.0, 1), ("d", 75.0, 1.0, 0)]}
    assert sorted(keys, key=keys.__getitem__) == ["c", "b", "d", "a"]


def test_slurm_factor() -> None:
    assert factors({}, {"a": 1.0, "b": 1.0}) == {"a": 1.0, "b": 1.0}
    f = factors({"a": 100.0, "b": 100.0}, {"a": 1.0, "b": 1.0})
    assert f == pytest.approx({"a": 0.5, "b": 0.5})
    f = factors({"a": 300.0, "b": 100.0}, {"a": 1.0, "b": 1.0})
    assert f["a"] < 0.5 < f["b"]  # the order of usage per weight, reversed


def test_the_layer_charges_what_each_queue_reserved_until_the_next_cycle() -> None:
    layer = QueueLayer(queues(half_life_s=H, a={"nominal": 4}, b={"nominal": 4}))
    cl = cluster(2, 4)
    specs = ones("a", 3)
    views = {s.job_id: JobView.make(s, False, 0.0, 0.0) for s in specs}
    snap = Snapshot(0.0, cl, MappingProxyType(views), ())
    gate = layer.gate(CyclePlacement(cl, "count"), snap)
    for s in specs:
        assert gate.try_place(s.job_id, 1) is not None
    later = Snapshot(H, cl, MappingProxyType(views), ())
    layer.gate(CyclePlacement(cl, "count"), later)
    assert layer.usage.of("a") == pytest.approx(3 * H / math.log(2) * 0.5)
    assert layer.usage.of("b") == 0.0
