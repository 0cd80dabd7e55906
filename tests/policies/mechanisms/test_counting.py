"""`count_walk`: the counted walk over running jobs' sorted ranks decides as `greedy_fill`'s
counted walk does, reading only the running jobs near the end of the order."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from sortedcontainers import SortedList

from domain.placement import CyclePlacement
from policies.base import JobView, Plan
from policies.mechanisms.counting import count_walk
from policies.mechanisms.walk import Stream, place_counted
from schemas.events import GpuSlots
from tests.builders import cluster, make_job, view
from tests.policies.test_count_walk import AHEAD, BESIDE, SPREAD, Walk, walks


def _gpus(slots: GpuSlots) -> int:
    return sum(len(g) for _, g in slots)


def _views(walk: Walk) -> dict[str, JobView]:
    views = {jid: view(make_job(jid).gpus(_gpus(slots)).build(), running=True)
             for jid, slots in walk.running.items()}
    return views | {jid: view(make_job(jid).gpus(g).build()) for jid, g in walk.waiting.items()}


def _streams(walk: Walk) -> list[Stream]:
    """The waiting jobs, one sorted stream per GPU count (as `OrderedPolicy` keeps them)."""
    by_size: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for jid, g in walk.waiting.items():
        by_size[g].append((walk.rank[jid], jid))
    return [(g, iter(sorted(items))) for g, items in by_size.items()]


def counted(walk: Walk, read: list[str] | None = None
            ) -> tuple[list[str], set[str], Plan, CyclePlacement]:
    """`count_walk` on a cycle opened in full, then the plan it leads to: the jobs it starts,
    those it gives up, the plan of the starts and the placement after it."""
    fit = CyclePlacement(walk.cl, "count", walk.running)
    order = SortedList((walk.rank[jid], jid) for jid in walk.running)

    def gpus_of(job_id: str) -> int:
        if read is not None:
            read.append(job_id)
        return _gpus(walk.running[job_id])

    starting, given_up = count_walk(order, gpus_of, _streams(walk), _views(walk), fit)
    assert fit.stay_but(walk.running.keys(), given_up)
    plan = Plan(stay=True, preempted=given_up)
    place_counted(plan, starting, fit, "test", {})
    return [jid for jid, _, _ in starting], given_up, plan, fit


@pytest.mark.parametrize(("walk", "start", "give_up"), [
    (AHEAD, ["w"], {"b"}),
    (BESIDE, ["w"], set()),
    (SPREAD, ["w"], {"c", "d"}),
], ids=["ahead", "beside", "spread"])
def test_counted_walk_starts_and_gives_up_as_the_walk_does(
        walk: Walk, start: list[str], give_up: set[str]) -> None:
    starting, given_up, plan, _ = counted(walk)
    assert (starting, given_up) == (start, give_up)
    walked, _ = walk.fill()  # greedy_fill's counted walk
    assert plan.run == {jid: walked.run[jid] for jid in start}


def test_counted_walk_reads_only_the_running_jobs_at_the_end() -> None:
    """A hundred 1-GPU jobs fill 100 GPUs; a 2-GPU job ranks first: the last two stop, and
    the walk reads no running job ahead of them."""
    running = {f"r{i:03}": ((f"n{i // 4}", (i % 4,)),) for i in range(100)}
    rank = {jid: i + 1 for i, jid in enumerate(running)} | {"w": 0}
    walk = Walk(cluster(25, 4), running, {"w": 2}, rank)
    read: list[str] = []
    starting, given_up, _, fit = counted(walk, read)
    assert (starting, given_up) == (["w"], {"r098", "r099"})
    assert sorted(read) == ["r098", "r099"]
    assert fit.free_gpus == 0


@settings(max_examples=300, deadline=None)
@given(walk=walks())
def test_counted_walk_decides_as_greedy_fill_counts(walk: Walk) -> None:
    starting, given_up, plan, fit = counted(walk)
    walked, walked_fit = walk.fill()
    assert starting == [jid for jid in walked.run if jid in walk.waiting]  # in walk order
    assert given_up == walk.running.keys() - walked.run.keys()
    assert plan.run == {jid: walked.run[jid] for jid in starting}  # on the same GPUs
    assert fit.free_gpus == walked_fit.free_gpus == walked.free_gpus
