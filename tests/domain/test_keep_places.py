"""Running jobs stay where they run when a cycle's placement can be dealt out otherwise
(domain/keep_places.py): indices dealt again within a node, nodes traded between gangs."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.keep_places import deal_indices, keep_in_plan, trade_nodes
from domain.topology import Topology
from schemas.events import GpuSlots, gpu_count
from tests.builders import cluster


def on(*parts: tuple[str, tuple[int, ...]]) -> GpuSlots:
    return tuple(parts)


def everywhere(node: str) -> bool:
    return True


@pytest.mark.parametrize(
    ("changed", "was", "expected"),
    [
        pytest.param(  # the new job took A's GPUs, A was given others on the same node
            {"x": on(("n0", (0, 1))), "a": on(("n0", (2, 3)))},
            {"a": on(("n0", (0, 1)))},
            {"a": on(("n0", (0, 1))), "x": on(("n0", (2, 3)))},
            id="swapped-back"),
        pytest.param(  # two running jobs that traded places both stay
            {"a": on(("n0", (2, 3))), "b": on(("n0", (0, 1)))},
            {"a": on(("n0", (0, 1))), "b": on(("n0", (2, 3)))},
            {"a": on(("n0", (0, 1))), "b": on(("n0", (2, 3)))},
            id="traded"),
        pytest.param(  # the others keep what they had of what is left, then take the lowest
            {"x": on(("n0", (0, 1, 4))), "a": on(("n0", (2, 3)))},
            {"a": on(("n0", (0, 1)))},
            {"a": on(("n0", (0, 1))), "x": on(("n0", (2, 3, 4)))},
            id="others-keep-their-own-first"),
        pytest.param(  # across nodes, on each node
            {"x": on(("n0", (0, 1, 2, 3)), ("n1", (0,))),
             "a": on(("n0", (4, 5, 6, 7)), ("n1", (1, 2, 3, 4, 5, 6, 7)))},
            {"a": on(("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3, 4, 5, 6)))},
            {"a": on(("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3, 4, 5, 6))),
             "x": on(("n0", (4, 5, 6, 7)), ("n1", (7,)))},
            id="multi-node"),
        pytest.param(  # moved to another node: a real move
            {"x": on(("n0", (0, 1))), "a": on(("n1", (0, 1)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="other-node"),
        pytest.param(  # grew: restarts anyway
            {"a": on(("n0", (2, 3, 4)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="other-count"),
        pytest.param(  # one of its old GPUs is not in use this cycle: the node's GPUs stay
            {"x": on(("n0", (0,))), "a": on(("n0", (2, 3)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="old-gpu-idle"),
        pytest.param(  # GPUs shared this cycle: left as placed
            {"x": on(("n0", (0, 1))), "a": on(("n0", (0, 1)))},
            {"a": on(("n0", (2, 3)))},
            {},
            id="shared"),
        pytest.param(  # unchanged jobs stay unchanged
            {"a": on(("n0", (0, 1)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="unchanged"),
    ],
)
def test_a_job_that_stays_on_its_nodes_gets_its_gpus_back(
        changed: Mapping[str, GpuSlots], was: Mapping[str, GpuSlots],
        expected: Mapping[str, GpuSlots]) -> None:
    assert deal_indices(changed.items(), was, everywhere) == expected


def test_a_node_whose_gpus_differ_keeps_the_walks_choice_for_every_job_on_it() -> None:
    changed = {"x": on(("n0", (0, 1)), ("n1", (0, 1))), "a": on(("n0", (2, 3)), ("n1", (2, 3)))}
    was = {"a": on(("n0", (0, 1)), ("n1", (0, 1)))}
    assert deal_indices(changed.items(), was, lambda node: node != "n1") == {}


TYPES = {"n0": "V100", "n1": "V100", "n2": "K80"}


@pytest.mark.parametrize(
    ("changed", "was", "expected"),
    [
        pytest.param(  # a new gang of its size took its node: they trade
            {"x": on(("n0", (0, 1))), "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (0, 1)))},
            {"a": on(("n0", (0, 1))), "x": on(("n1", (4, 5)))},
            id="traded"),
        pytest.param(  # the first gang of its size on its old node, in plan order
            {"x": on(("n0", (2, 3))), "y": on(("n0", (0, 1))), "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (0, 1)))},
            {"a": on(("n0", (2, 3))), "x": on(("n1", (4, 5)))},
            id="first-of-its-size"),
        pytest.param(  # two running jobs that crossed over both go home
            {"a": on(("n1", (0, 1))), "b": on(("n0", (0, 1)))},
            {"a": on(("n0", (0, 1))), "b": on(("n1", (0, 1)))},
            {"a": on(("n0", (0, 1))), "b": on(("n1", (0, 1)))},
            id="crossed"),
        pytest.param(  # only gangs of its size
            {"x": on(("n0", (0, 1, 2, 3))), "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="other-size"),
        pytest.param(  # a running job back on its own node stays there
            {"b": on(("n0", (0, 1))), "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (0, 1))), "b": on(("n0", (2, 3)))},
            {},
            id="home-stays"),
        pytest.param(  # never onto another GPU type
            {"x": on(("n0", (0, 1))), "a": on(("n2", (4, 5)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="other-type"),
        pytest.param(  # its own GPUs there are not all in use: it would restart anyway
            {"x": on(("n0", (2, 3))), "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="own-gpus-idle"),
        pytest.param(  # two 2-GPU gangs on its old node take its 4 GPUs
            {"x": on(("n0", (0, 1))), "y": on(("n0", (2, 3))), "a": on(("n1", (4, 5, 6, 7)))},
            {"a": on(("n0", (0, 1, 2, 3)))},
            {"a": on(("n0", (0, 1, 2, 3))), "x": on(("n1", (4, 5))), "y": on(("n1", (6, 7)))},
            id="two-for-one"),
        pytest.param(  # a 4-GPU gang took the node two jobs left together: all three trade
            {"g": on(("n0", (0, 1, 2, 3))), "a": on(("n1", (0, 1))), "b": on(("n1", (2, 3)))},
            {"a": on(("n0", (0, 1))), "b": on(("n0", (2, 3)))},
            {"g": on(("n1", (0, 1, 2, 3))), "a": on(("n0", (0, 1))), "b": on(("n0", (2, 3)))},
            id="one-for-two"),
        pytest.param(  # a gang that goes home too beats one that does not, of the same size
            {"x": on(("n0", (0, 1))), "b": on(("n0", (2, 3))), "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (0, 1))), "b": on(("n1", (4, 5)))},
            {"a": on(("n0", (2, 3))), "b": on(("n1", (4, 5)))},
            id="most-sent-home"),
        pytest.param(  # the fewest gangs moved: one 2-GPU gang rather than two 1-GPU ones
            {"x": on(("n0", (0,))), "y": on(("n0", (1,))), "z": on(("n0", (2, 3))),
             "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (2, 3)))},
            {"a": on(("n0", (2, 3))), "z": on(("n1", (4, 5)))},
            id="fewest-moved"),
        pytest.param(  # no set of its old node's gangs adds up to its size
            {"x": on(("n0", (0, 1, 2))), "a": on(("n1", (4, 5)))},
            {"a": on(("n0", (0, 1)))},
            {},
            id="no-matching-set"),
    ],
)
def test_a_job_moved_off_its_node_trades_with_gangs_of_as_many_gpus_there(
        changed: Mapping[str, GpuSlots], was: Mapping[str, GpuSlots],
        expected: Mapping[str, GpuSlots]) -> None:
    assert trade_nodes(changed.items(), was, everywhere, TYPES) == expected


def test_no_trade_onto_a_node_whose_gpus_differ() -> None:
    changed = {"x": on(("n0", (0, 1))), "a": on(("n1", (4, 5)))}
    assert trade_nodes(changed.items(), {"a": on(("n0", (0, 1)))},
                       lambda node: node != "n1", TYPES) == {}


class Rec:
    def __init__(self, placement: GpuSlots, group: tuple[str, ...] = ()) -> None:
        self.placement, self.group = placement, group


def test_a_plan_keeps_running_jobs_where_they_run_unless_it_is_not_the_schemes_to() -> None:
    topo = Topology(cluster(2, 8))
    running = {"k": Rec(on(("n1", (0,)))), "a": Rec(on(("n0", (0, 1))))}
    walked = {"k": on(("n1", (0,))), "x": on(("n0", (0, 1))), "a": on(("n1", (3, 4)))}
    for scheme, chosen, a in [("consolidated", False, on(("n0", (0, 1)))),
                              ("count", False, on(("n0", (0, 1)))),
                              ("consolidated", True, walked["a"]),  # nodes are the policy's
                              ("buddy", False, walked["a"]), ("yarn", False, walked["a"])]:
        run = dict(walked)
        keep_in_plan(run, 1, {}, running, topo, scheme, nodes_chosen=chosen)
        assert run["k"] == walked["k"] and run["a"] == a, scheme
        if a != walked["a"]:  # x went where a was put, on the GPUs a left there
            assert run["x"] == on(("n1", (3, 4)))
    grouped = dict(walked)
    keep_in_plan(grouped, 1, {"a": ("a", "x"), "x": ("a", "x")}, running, topo, "count")
    assert grouped == walked  # jobs that share GPUs are left as placed


def test_gpus_with_nvlink_pairs_or_out_of_service_are_not_dealt_again() -> None:
    running = {"a": Rec(on(("n0", (0, 1))))}
    walked = {"x": on(("n0", (0, 1))), "a": on(("n0", (2, 3)))}
    for make in (lambda t: t.learn_links("n0", [(0, 1)]), lambda t: t.take_out("n0", [7])):
        topo = Topology(cluster(2, 8))
        make(topo)
        run = dict(walked)
        keep_in_plan(run, 0, {}, running, topo, "consolidated")
        assert run == walked


NODES = ("n0", "n1")


@st.composite
def cycles(draw: st.DrawFn) -> tuple[dict[str, GpuSlots], dict[str, GpuSlots]]:
    """Running jobs on disjoint GPUs of two 8-GPU nodes, then a cycle that places some of
    them (and new jobs) on disjoint GPUs again."""
    def deal(jobs: list[str]) -> dict[str, GpuSlots]:
        out: dict[str, GpuSlots] = {}
        for node in NODES:
            order = draw(st.permutations(range(8)))
            cut = 0
            for job in jobs:
                take = draw(st.integers(0, 8 - cut))
                if take:
                    out[job] = (*out.get(job, ()), (node, tuple(sorted(order[cut:cut + take]))))
                    cut += take
        return out
    names = [f"j{i}" for i in range(draw(st.integers(1, 6)))]
    was = deal(names)
    again = draw(st.lists(st.sampled_from(names), unique=True))
    changed = deal(again + [f"new{i}" for i in range(draw(st.integers(0, 3)))])
    return changed, was


@given(cycles())
def test_dealing_again_keeps_each_nodes_gpus_and_each_jobs_counts(
        cycle: tuple[dict[str, GpuSlots], dict[str, GpuSlots]]) -> None:
    changed, was = cycle
    dealt = {**changed, **deal_indices(changed.items(), was, everywhere)}
    assert dealt.keys() == changed.keys()

    def per_node(plan: Mapping[str, GpuSlots]) -> dict[str, list[int]]:
        used: dict[str, list[int]] = {}
        for slots in plan.values():
            for node, gpus in slots:
                used.setdefault(node, []).extend(gpus)
        return {node: sorted(gpus) for node, gpus in used.items()}

    assert per_node(dealt) == per_node(changed)  # same GPUs in use, none twice
    for job, slots in changed.items():
        assert [(n, len(g)) for n, g in dealt[job]] == [(n, len(g)) for n, g in slots]
    stayed = [j for j in changed if j in was and changed[j] == was[j]]
    assert all(dealt[j] == was[j] for j in stayed)
    assert sum(dealt[j] == was.get(j) for j in changed) >= len(stayed)


@given(cycles(), st.data())
def test_a_cycle_that_only_renumbers_gpus_changes_no_running_job(
        cycle: tuple[dict[str, GpuSlots], dict[str, GpuSlots]], data: st.DataObject) -> None:
    _, was = cycle
    renumber: dict[str, dict[int, int]] = {}
    for node in NODES:  # the GPUs in use on each node dealt out again among its jobs
        used = sorted(g for slots in was.values() for n, gpus in slots if n == node
                      for g in gpus)
        renumber[node] = dict(zip(used, data.draw(st.permutations(used)), strict=True))
    changed = {j: tuple((n, tuple(sorted(renumber[n][g] for g in gpus))) for n, gpus in slots)
               for j, slots in was.items()}
    dealt = {**changed, **deal_indices(changed.items(), was, everywhere)}
    assert dealt == was


@st.composite
def gang_moves(draw: st.DrawFn) -> tuple[dict[str, GpuSlots], dict[str, GpuSlots]]:
    """Single-node gangs on two 8-GPU nodes, then a cycle that puts some of them (each with
    as many GPUs) and new gangs on either node, both from each node's GPUs in one drawn order
    (so the cycle uses the GPUs the running jobs had): the moves trades are for, of every mix
    of sizes."""
    orders = {node: draw(st.permutations(range(8))) for node in NODES}

    def pack(gangs: list[tuple[str, int, str]]) -> dict[str, GpuSlots]:
        order = dict(orders)
        out: dict[str, GpuSlots] = {}
        for job, gpus, node in gangs:
            if gpus <= len(order[node]):
                out[job] = ((node, tuple(sorted(order[node][:gpus]))),)
                order[node] = order[node][gpus:]
        return out
    sizes = st.sampled_from([1, 2, 2, 4])
    nodes = st.sampled_from(NODES)
    was = pack([(f"j{i}", draw(sizes), draw(nodes)) for i in range(draw(st.integers(1, 8)))])
    again = draw(st.lists(st.sampled_from(sorted(was)), unique=True))
    gangs = [(j, gpu_count(was[j]), draw(nodes)) for j in again]
    gangs += [(f"new{i}", draw(sizes), draw(nodes)) for i in range(draw(st.integers(0, 4)))]
    return pack(draw(st.permutations(gangs))), was


@given(st.one_of(cycles(), gang_moves()))
def test_trading_keeps_each_nodes_gpus_and_sends_no_running_job_away_from_home(
        cycle: tuple[dict[str, GpuSlots], dict[str, GpuSlots]]) -> None:
    changed, was = cycle
    was = {j: slots for j, slots in was.items() if j in changed}
    trades = trade_nodes(changed.items(), was, everywhere, TYPES)
    traded = {**changed, **trades}

    def used(plan: Mapping[str, GpuSlots]) -> list[tuple[str, int]]:
        return sorted((n, g) for slots in plan.values() for n, gpus in slots for g in gpus)

    def home(plan: Mapping[str, GpuSlots]) -> set[str]:
        return {j for j, old in was.items()
                if len(old) == 1 and len(plan[j]) == 1 and plan[j][0][0] == old[0][0]}

    assert used(traded) == used(changed)
    assert ({j: gpu_count(slots) for j, slots in traded.items()}
            == {j: gpu_count(slots) for j, slots in changed.items()})
    assert home(changed) <= home(traded)
    if trades:  # every swap sends at least the job it was for home
        assert len(home(traded)) > len(home(changed))


def _same_without_jobs_left_in_place(changed: dict[str, GpuSlots],
                                     was: dict[str, GpuSlots]) -> None:
    """`keep_in_plan` leaves out the running jobs a cycle placed where they run: it keeps the
    plan both ways would make with every job of the cycle in them (in plan order)."""
    running = {j: Rec(slots) for j, slots in was.items()}
    topo = Topology(cluster(2, 8))
    expected = dict(changed)
    moved = {j: was[j] for j in changed if j in was}  # in plan order, as `keep_in_plan`
    if any(changed[j] != old for j, old in moved.items()):
        traded = trade_nodes(changed.items(), moved, everywhere, topo.type_of)
        expected.update(traded)
        expected.update(deal_indices(expected.items(), moved, everywhere))
    run = dict(changed)
    keep_in_plan(run, 0, {}, running, topo, "consolidated")
    assert run == expected


@given(st.one_of(cycles(), gang_moves()))
def test_running_jobs_placed_where_they_run_change_nothing_traded_or_dealt(
        cycle: tuple[dict[str, GpuSlots], dict[str, GpuSlots]]) -> None:
    _same_without_jobs_left_in_place(*cycle)


def test_of_two_ways_home_the_plan_order_decides_with_jobs_left_in_place_or_not() -> None:
    """j3 and j2 may each go home; which is tried first follows the plan, with j1 (left where
    it runs) in it or not."""
    _same_without_jobs_left_in_place(
        {"j1": on(("n0", (0,))), "j2": on(("n0", (1,))), "j3": on(("n1", (0,))),
         "j5": on(("n1", (1,))), "j0": on(("n0", (2,)))},
        {"j0": on(("n1", (0,))), "j1": on(("n0", (0,))), "j2": on(("n1", (1,))),
         "j3": on(("n0", (1,))), "j4": on(("n0", (2,))), "j5": on(("n1", (2,)))})
