"""A walk keeps running jobs that come one after another in one call (`Fitter.keep_in_turn`,
policies/base.py `_keep_in_turn`): the plan and the placement it leaves are those of the walk
that places each of them in turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.placement import CyclePlacement
from domain.topology import Topology
from policies.base import Plan
from policies.mechanisms.walk import Stream, greedy_fill
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots
from schemas.job import JobSpec
from tests.builders import cluster, make_job, view


class _OneByOne(CyclePlacement):
    """The same placement, each running job placed in turn by the walk itself."""

    def keep_in_turn(self, job_ids: Sequence[str], gpus: Sequence[int], below: int,
                     start: int = 0) -> list[GpuSlots | None]:
        return []


@dataclass(frozen=True)
class Walk:
    """A cycle opened in full on nodes of one size: running jobs (some resized: holding other
    than their gang's count), waiting ones, ranks over both, and whether the running jobs
    come in a stream of their own (as ordered policies walk them) or mixed with the waiting
    ones; with `stay`, those ahead of every waiting job stay unlisted (`stay_all_but`)."""

    cl: ClusterSpec
    scheme: str
    running: dict[str, GpuSlots]
    resized: frozenset[str]
    waiting: dict[str, int]  # GPUs
    rank: dict[str, int]
    apart: bool
    stay: bool
    out: tuple[str, int] | None  # a GPU out of service

    def specs(self) -> dict[str, JobSpec]:
        specs = {jid: make_job(jid).gpus(sum(len(g) for _, g in slots)
                                         + (jid in self.resized)).build()
                 for jid, slots in self.running.items()}
        return specs | {jid: make_job(jid).gpus(g).build() for jid, g in self.waiting.items()}

    def fill(self, placement: type[CyclePlacement]) -> tuple[Plan, CyclePlacement]:
        topo = Topology(self.cl)
        if self.out is not None:
            topo.take_out(self.out[0], [self.out[1]])
        fit = placement(topo, self.scheme, self.running)  # type: ignore[arg-type]
        specs = self.specs()
        views = {jid: view(spec, running=jid in self.running) for jid, spec in specs.items()}
        ranked = sorted((self.rank[jid], jid) for jid in specs)
        first_waiting = min((r for r in ranked if r[1] in self.waiting), default=None)
        ahead = {jid for r, jid in ranked if jid in self.running
                 and (first_waiting is None or (r, jid) < first_waiting)}
        if self.stay and ahead:
            assert fit.stay_all_but(self.running.keys(), set(self.running) - ahead)
        else:
            ahead = set()
        walked = [(r, jid) for r, jid in ranked if jid not in ahead]
        streams: list[Stream]
        if self.apart:
            streams = [(None, iter([r for r in walked if r[1] in self.running]))]
            for g in sorted(set(self.waiting.values())):
                streams.append((g, iter([r for r in walked if self.waiting.get(r[1]) == g])))
        else:
            streams = [(None, iter(walked))]
        running_spec = {jid: specs[jid] for jid in self.running}.get
        return greedy_fill(streams, views, fit, "test", None, running_spec), fit


@st.composite
def walks(draw: st.DrawFn) -> Walk:
    size = draw(st.sampled_from([2, 4, 8]))
    nodes = draw(st.integers(1, 4))
    running: dict[str, GpuSlots] = {}
    free = [(f"n{n}", i) for n in range(nodes) for i in range(size)]
    for _ in range(draw(st.integers(0, 8))):
        if not free:
            break
        g = draw(st.integers(1, min(len(free), 2 * size)))
        taken = sorted(free[:g]) if draw(st.booleans()) else sorted(draw(st.permutations(free))[:g])
        free = [gpu for gpu in free if gpu not in taken]
        by_node: dict[str, list[int]] = {}
        for node, i in taken:
            by_node.setdefault(node, []).append(i)
        running[f"r{len(running)}"] = tuple((node, tuple(i)) for node, i in by_node.items())
    resized = frozenset(jid for jid in running if draw(st.integers(0, 5)) == 0)
    waiting = {f"w{i}": g for i, g in enumerate(
        draw(st.lists(st.integers(1, size * nodes), max_size=6)))}
    order = draw(st.permutations([*running, *waiting]))
    out = None
    if draw(st.integers(0, 5)) == 0:
        out = (f"n{draw(st.integers(0, nodes - 1))}", draw(st.integers(0, size - 1)))
    return Walk(cluster(nodes, size), draw(st.sampled_from(["consolidated", "buddy"])),
                running, resized, waiting, {jid: i for i, jid in enumerate(order)},
                draw(st.booleans()), draw(st.booleans()), out)


@settings(max_examples=300, deadline=None)
@given(walk=walks())
def test_running_jobs_kept_in_turn_leave_the_plan_and_placement_of_the_walk(walk: Walk
                                                                            ) -> None:
    plan, fit = walk.fill(CyclePlacement)
    one, ref = walk.fill(_OneByOne)
    assert list(plan.run.items()) == list(one.run.items())  # the same jobs, GPUs and order
    assert plan.blocked == one.blocked
    assert (plan.unfit_sizes, plan.unfit_from, plan.fragmented, plan.free_gpus) == (
        one.unfit_sizes, one.unfit_from, one.fragmented, one.free_gpus)
    assert (fit.free_gpus, fit.largest_block()) == (ref.free_gpus, ref.largest_block())


def test_a_run_of_running_jobs_is_kept_in_one_call_up_to_the_next_waiting_job() -> None:
    """a, b and c run on 2-GPU slots of two 4-GPU nodes; w (4 GPUs) ranks after a and takes
    b's node (displacing b): a is kept, w placed, c kept, and b, whose GPUs are gone, is not
    reached (no GPU is left), so it stops."""
    on: dict[str, GpuSlots] = {"a": (("n0", (0, 1)),), "b": (("n1", (0, 1)),),
                               "c": (("n0", (2, 3)),)}
    walk = Walk(cluster(2, 4), "consolidated", on, frozenset(), {"w": 4},
                {"a": 0, "w": 1, "c": 2, "b": 3}, apart=True, stay=False, out=None)
    plan, fit = walk.fill(CyclePlacement)
    assert plan.run == {"a": on["a"], "w": (("n1", (0, 1, 2, 3)),), "c": on["c"]}
    assert (plan.blocked, plan.free_gpus, fit.free_gpus) == ({}, 0, 0)


def test_a_running_job_as_wide_as_a_gang_that_failed_is_not_kept() -> None:
    """r0 holds two GPUs on each of two 4-GPU nodes, r1 and r2 the others; w (4 GPUs) ranks
    after r1 and r2 and finds no node (r0's halves are all it may displace), so the walk
    places no gang of 4 after it: r0 stops although its GPUs are still free."""
    on: dict[str, GpuSlots] = {"r0": (("n0", (0, 1)), ("n1", (0, 1))),
                               "r1": (("n0", (2, 3)),), "r2": (("n1", (2, 3)),)}
    walk = Walk(cluster(2, 4), "consolidated", on, frozenset(), {"w": 4},
                {"r1": 0, "r2": 1, "w": 2, "r0": 3}, apart=True, stay=False, out=None)
    plan, _ = walk.fill(CyclePlacement)
    one, _ = walk.fill(_OneByOne)
    assert plan.run == one.run == {"r1": on["r1"], "r2": on["r2"]}
    assert list(plan.blocked) == ["w"] and plan.unfit_from == 4
