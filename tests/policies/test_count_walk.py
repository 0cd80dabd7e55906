"""A walk where counts alone decide what fits (`Fitter.counts_decide`, the `count` scheme):
`greedy_fill` counts it first, so the running jobs that stay keep their GPUs and the jobs that
start take those of the jobs that stop (policies/base.py `_fill_counted`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.placement import CyclePlacement
from policies.base import Plan
from policies.mechanisms.walk import greedy_fill
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots
from tests.builders import cluster, make_job, view


class _Walked(CyclePlacement):
    """The same placement, walked one job at a time as where counts do not decide."""

    counts_decide = False  # type: ignore[assignment]


@dataclass(frozen=True)
class Walk:
    """A cycle opened in full: running jobs on their GPUs, waiting ones, and every job's rank
    (lower runs first)."""

    cl: ClusterSpec
    running: dict[str, GpuSlots]
    waiting: dict[str, int]  # GPUs
    rank: dict[str, int]

    def fill(self, counted: bool = True) -> tuple[Plan, CyclePlacement]:
        fit = (CyclePlacement if counted else _Walked)(self.cl, "count", self.running)
        views = {jid: view(make_job(jid).gpus(sum(len(g) for _, g in slots)).build(),
                           running=True) for jid, slots in self.running.items()}
        views |= {jid: view(make_job(jid).gpus(g).build()) for jid, g in self.waiting.items()}
        stream = iter(sorted((self.rank[jid], jid) for jid in views))
        return greedy_fill([(None, stream)], views, fit, "test"), fit


def one_node(jid: str, node: str, *gpus: int) -> tuple[str, GpuSlots]:
    return jid, ((node, gpus),)


# Two nodes of 4 GPUs; `w` (4 GPUs) ranks ahead of running `a` and `b` (4 each): `b`, last,
# no longer fits. Walked one by one, `w` takes the first node it may displace (`a`'s), and `a`
# then moves onto `b`'s GPUs.
AHEAD = Walk(cluster(2, 4),
             dict([one_node("a", "n0", 0, 1, 2, 3), one_node("b", "n1", 0, 1, 2, 3)]),
             {"w": 4}, {"w": 0, "a": 1, "b": 2})
# `w` (2 GPUs) between them: it takes the two idle GPUs, nobody stops.
BESIDE = Walk(cluster(2, 4), dict([one_node("a", "n0", 0, 1), one_node("b", "n1", 0, 1, 2, 3)]),
              {"w": 2}, {"a": 0, "w": 1, "b": 2})
# Four 2-GPU jobs on two nodes; `w` (4 GPUs) ranks first and `c`, `d` no longer fit. Counted,
# `w` spreads over their GPUs; walked, it takes a whole node that `a` holds, `a` moves onto
# `b`'s and `b` onto `d`'s.
SPREAD = Walk(cluster(2, 4), dict([one_node("a", "n0", 0, 1), one_node("c", "n0", 2, 3),
                                   one_node("b", "n1", 0, 1), one_node("d", "n1", 2, 3)]),
              {"w": 4}, {"w": 0, "a": 1, "b": 2, "c": 3, "d": 4})


@pytest.mark.parametrize(("walk", "run", "moved_when_walked"), [
    (AHEAD, {"w": (("n1", (0, 1, 2, 3)),), "a": (("n0", (0, 1, 2, 3)),)}, {"a"}),
    (BESIDE, {"a": (("n0", (0, 1)),), "w": (("n0", (2, 3)),), "b": (("n1", (0, 1, 2, 3)),)},
     set()),
    (SPREAD, {"w": (("n0", (2, 3)), ("n1", (2, 3))), "a": (("n0", (0, 1)),),
              "b": (("n1", (0, 1)),)}, {"a", "b"}),
], ids=["ahead", "beside", "spread"])
def test_counted_walk_keeps_the_staying_jobs_where_they_run(
        walk: Walk, run: dict[str, GpuSlots], moved_when_walked: set[str]) -> None:
    plan, _ = walk.fill()
    walked, _ = walk.fill(counted=False)
    assert plan.run == run
    assert list(plan.run) == list(walked.run)  # the same jobs, in walk order
    assert {jid for jid, slots in walked.run.items()
            if jid in walk.running and slots != walk.running[jid]} == moved_when_walked


@st.composite
def walks(draw: st.DrawFn) -> Walk:
    """Nodes of one size with single-node running jobs dealt over them, waiting jobs of any
    size, and ranks shuffled over both."""
    size = draw(st.sampled_from([2, 4, 8]))
    nodes = draw(st.integers(1, 4))
    running: dict[str, GpuSlots] = {}
    for n in range(nodes):
        gpu = 0
        while gpu < size:
            g = draw(st.integers(1, size - gpu))
            if draw(st.booleans()):
                running[f"r{len(running)}"] = ((f"n{n}", tuple(range(gpu, gpu + g))),)
            gpu += g
    waiting = {f"w{i}": g for i, g in enumerate(
        draw(st.lists(st.integers(1, size * nodes), max_size=6)))}
    order = draw(st.permutations([*running, *waiting]))
    return Walk(cluster(nodes, size), running, waiting, {jid: i for i, jid in enumerate(order)})


@settings(max_examples=200, deadline=None)
@given(walk=walks())
def test_counted_walk_places_what_the_walk_places_and_moves_no_running_job(walk: Walk) -> None:
    plan, fit = walk.fill()
    walked, _ = walk.fill(counted=False)
    assert list(plan.run) == list(walked.run)  # the same jobs, in walk order
    assert plan.free_gpus == walked.free_gpus == fit.free_gpus
    assert not plan.blocked
    for jid in plan.run.keys() & walk.running.keys():
        assert plan.run[jid] == walk.running[jid]  # staying jobs keep their GPUs
    gpus = [(node, i) for slots in plan.run.values() for node, idx in slots for i in idx]
    assert len(gpus) == len(set(gpus))  # no GPU handed out twice
    total = sum(n.gpus for n in walk.cl.nodes)
    assert len(gpus) + plan.free_gpus == total
