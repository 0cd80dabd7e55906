"""A CyclePlacement kept across cycles (bind, release, next_cycle) and searched through its
index places exactly as a fresh, scanned one of the same running jobs (domain/placement.py);
running jobs kept ahead at once (`keep_ahead`, or `keep_all_but` those walked) leave the state
re-placing each would.

The reference for every cycle is `CyclePlacement(cluster, scheme, previous=<running jobs>)`
built from scratch and scanning every node (an index only from more nodes than any cluster here
has); the subject is one CyclePlacement for the whole run, indexed from the first node.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.placement import SCHEMES, CyclePlacement
from domain.topology import Topology
from schemas.cluster import ClusterSpec, NodeSpec
from schemas.events import GpuSlots

NEVER = 10**9  # index_from for the scanned reference


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSpec:
    switches = draw(st.integers(1, 3))
    per_switch = draw(st.integers(1, 4))
    mixed_sizes = draw(st.booleans())
    types = draw(st.sampled_from([("A",), ("A", "B")]))
    nodes = []
    for s in range(switches):
        for k in range(per_switch):
            size = draw(st.sampled_from([2, 4, 8])) if mixed_sizes else 4
            nodes.append(NodeSpec(node_id=f"s{s}n{k}", switch_id=f"sw{s}", gpus=size,
                                  gpu_type=draw(st.sampled_from(types))))
    return ClusterSpec(name="c", nodes=tuple(nodes))


# One cycle: jobs (of 8) asking, in this order, for GPUs (0: as many as it runs on, if it
# runs), of a type or any, and whether it then runs on (bound) into the next cycle.
cycle_ops = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 12),
                               st.sampled_from([None, "A", "B"]), st.booleans()),
                     min_size=1, max_size=14)
# GPUs out of service from a cycle on, (node, GPU) pairs: None keeps the last cycle's.
out_of_service = st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 11), st.integers(0, 7)),
                                               max_size=3))


def take_out(topo: Topology, cl: ClusterSpec, pairs: list[tuple[int, int]]) -> set[tuple[str, int]]:
    """Put exactly `pairs` out of service (GPU indices past a node's size are ignored)."""
    chosen: dict[str, set[int]] = {n.node_id: set() for n in cl.nodes}
    for node, gpu in pairs:
        spec = cl.nodes[node % len(cl.nodes)]
        if gpu < spec.gpus:
            chosen[spec.node_id].add(gpu)
    for node_id, gpus in chosen.items():
        topo.take_out(node_id, gpus)
    return {(n, g) for n, gpus in chosen.items() for g in gpus}


@settings(max_examples=300, deadline=None)
@given(cl=clusters(), scheme=st.sampled_from(SCHEMES),
       cycles=st.lists(st.tuples(cycle_ops, st.booleans(), out_of_service, st.integers(0, 8),
                                 st.sampled_from(["named", "all-but", "all-but-unlisted"])),
                       min_size=1, max_size=6),
       cordon=st.lists(st.integers(0, 11), max_size=2))
def test_kept_and_indexed_places_as_a_fresh_scan(
        cl: ClusterSpec, scheme: str,
        cycles: list[tuple[list[tuple[int, int, str | None, bool]], bool,
                           list[tuple[int, int]] | None, int, str]],
        cordon: list[int]) -> None:
    """Each cycle may be opened in place: the reference then re-places every running job
    where it was first (what an in-place cycle stands for) and places only the others.
    Opened in full, the first `ahead` running jobs may be kept ahead at once (named, or as
    all but the others, listed or not): the reference re-places each of them first. GPUs
    out of service (health) change between cycles: no job is given one it did not hold."""
    topo = Topology(cl)
    cordoned = {cl.nodes[i % len(cl.nodes)].node_id for i in cordon}
    out: set[tuple[str, int]] = set()
    kept = CyclePlacement(topo, scheme, cordoned=cordoned, index_from=1)  # type: ignore[arg-type]
    running: dict[str, GpuSlots] = {}
    for n, (ops, in_place, pairs, ahead, keep) in enumerate(cycles):
        in_place = in_place and scheme != "yarn" and n > 0  # yarn re-packs running jobs
        if pairs is not None and n:
            out = take_out(topo, cl, pairs)
        fresh = CyclePlacement(topo, scheme, dict(running), cordoned=cordoned,  # type: ignore[arg-type]
                               index_from=NEVER)
        if n:
            kept.next_cycle(cordoned, in_place=in_place)
        after: dict[str, GpuSlots] = {}
        first = sorted(running) if in_place else sorted(running)[:ahead]
        if first and not in_place:
            rest = sorted(running)[ahead:]
            got_ahead = (kept.keep_ahead(first) if keep == "named"
                         else kept.keep_all_but(running.keys(), set(rest)) if keep == "all-but"
                         else kept.stay_all_but(running.keys(), set(rest)) or None)
            if scheme == "yarn" or len(cl.gpus_by_type) > 1:  # nothing bound; a profile's pick
                assert got_ahead is None
                first = []
            else:
                if keep != "all-but-unlisted":
                    assert got_ahead == {job: running[job] for job in first}
                assert kept.keep_ahead(first[:1]) is None  # once, first thing in a cycle
                assert kept.keep_all_but(running.keys(), set(rest)) is None
                assert not kept.stay_all_but(running.keys(), set(rest))
        for job in first:
            slots = running[job]
            assert fresh.try_place(job, sum(len(g) for _, g in slots)) == slots
            after[job] = slots
        ops = [op for op in ops if f"j{op[0]}" not in first]
        assert (kept.free_gpus, kept.largest_block()) == (fresh.free_gpus, fresh.largest_block())
        for slot, gpus, gpu_type, stays in ops:
            job = f"j{slot}"
            if gpus == 0:
                gpus = sum(len(g) for _, g in running.get(job, ())) or 1
            got = kept.try_place(job, gpus, gpu_type)
            assert got == fresh.try_place(job, gpus, gpu_type), (job, gpus, gpu_type)
            had = {(node, g) for node, gs in running.get(job, ()) for g in gs}
            assert not {(node, g) for node, gs in got or () for g in gs} & out - had
            assert kept.free_gpus == fresh.free_gpus
            assert kept.free_of("A") == fresh.free_of("A")
            if got is not None and stays:
                after[job] = got
        # Between cycles: the jobs that stopped are released, those that run (again) bound.
        for job in set(running) - set(after):
            kept.release(job)
        for job, slots in after.items():
            if running.get(job) != slots:
                kept.bind(job, slots)
        running = after


def test_a_running_job_is_not_placed_again_in_an_in_place_cycle() -> None:
    fit = CyclePlacement(ClusterSpec.uniform(1, 1, 4), previous={"a": (("n0", (0, 1)),)})
    fit.next_cycle(in_place=True)
    assert fit.free_gpus == 2
    with pytest.raises(ValueError, match="job a runs in place"):
        fit.try_place("a", 2)
    assert fit.try_place("b", 2) == (("n0", (2, 3)),)


def test_a_job_bound_twice_holds_only_its_last_gpus() -> None:
    cl = ClusterSpec.uniform(1, 2, 4)
    fit = CyclePlacement(cl, index_from=1)
    fit.bind("a", (("n0", (0, 1)),))
    fit.bind("a", (("n1", (0, 1)),))
    fit.next_cycle()
    # n0 is wholly unheld again: a 4-GPU job takes it without displacing anyone.
    assert fit.try_place("b", 4) == (("n0", (0, 1, 2, 3)),)
    assert fit.try_place("a", 2) == (("n1", (0, 1)),)


def test_a_released_job_leaves_its_gpus_unheld() -> None:
    cl = ClusterSpec.uniform(1, 1, 4)
    fit = CyclePlacement(cl, previous={"a": (("n0", (2, 3)),)})
    fit.release("a")
    fit.next_cycle()
    assert fit.try_place("b", 2) == (("n0", (0, 1)),)
    assert fit.try_place("a", 2) == (("n0", (2, 3)),)  # as a new job: not kept, just free


def test_links_learned_after_the_first_cycle_are_used_by_the_next() -> None:
    cl = ClusterSpec.uniform(1, 1, 4)
    topo = Topology(cl)
    fit = CyclePlacement(topo)
    topo.learn_links("n0", [(0, 2), (1, 3)])
    fit.next_cycle()
    assert fit.try_place("a", 2) == (("n0", (0, 2)),)


def test_a_gpu_out_of_service_takes_nothing_new_and_its_job_keeps_it() -> None:
    cl = ClusterSpec.uniform(1, 1, 4)
    topo = Topology(cl)
    fit = CyclePlacement(topo, previous={"a": (("n0", (1,)),)})
    topo.take_out("n0", [1, 2])
    fit.next_cycle()
    assert fit.free_gpus == 3  # GPU 2 is gone; GPU 1 is still a's to keep
    assert fit.try_place("b", 3) is None
    assert fit.try_place("a", 1) == (("n0", (1,)),)
    assert fit.try_place("b", 2) == (("n0", (0, 3)),)
    topo.take_out("n0", [])  # both healthy again
    fit.release("a")
    fit.next_cycle()
    assert fit.try_place("c", 4) == (("n0", (0, 1, 2, 3)),)


def _two_nodes_running() -> CyclePlacement:
    """Two 4-GPU nodes, indexed: a runs on 3 GPUs of n0, b on 2 of n1; opened in full."""
    return CyclePlacement(ClusterSpec.uniform(1, 2, 4), index_from=1,
                          previous={"a": (("n0", (0, 1, 2)),), "b": (("n1", (0, 1)),)})


@pytest.mark.parametrize(("keep", "told"), [
    pytest.param(lambda fit: fit.keep_ahead(["a"]), {"a": (("n0", (0, 1, 2)),)}, id="named"),
    pytest.param(lambda fit: fit.keep_all_but({"a", "b"}, {"b"}), {"a": (("n0", (0, 1, 2)),)},
                 id="all-but-the-walked"),
    pytest.param(lambda fit: fit.stay_all_but({"a", "b"}, {"b"}), True,
                 id="all-but-the-walked-unlisted"),
])
@pytest.mark.parametrize("opening", ["untouched", "index-asked-first", "index-asked-in-place"])
def test_a_job_kept_ahead_is_no_longer_there_to_displace(
        keep: Callable[[CyclePlacement], object], told: object, opening: str) -> None:
    fit = _two_nodes_running()
    if opening == "index-asked-first":
        assert fit.largest_block() == 4  # the index asked: it must learn of the keep
    elif opening == "index-asked-in-place":  # the index has the nodes as a cycle in place
        fit.next_cycle(in_place=True)
        assert fit.largest_block() == 2
        fit.next_cycle()
    assert keep(fit) == told
    assert (fit.free_gpus, fit.largest_block()) == (5, 4)
    # No node has 3 unheld GPUs; only b's node has 3 a gang may take, displacing b.
    assert fit.try_place("c", 3) == (("n1", (0, 2, 3)),)  # its unheld GPUs first
    assert fit.try_place("b", 2) is None


@pytest.mark.parametrize(("prepare", "ids"), [
    pytest.param(lambda fit: fit.try_place("c", 1), ["a"], id="something-placed-already"),
    pytest.param(lambda fit: fit.keep_ahead(["b"]), ["a"], id="kept-ahead-already"),
    pytest.param(lambda fit: fit.next_cycle(in_place=True), ["a"], id="opened-in-place"),
    pytest.param(lambda fit: None, ["a", "z"], id="a-job-not-running"),
    pytest.param(lambda fit: fit.bind("a", (("gone", (0,)),)), ["a"], id="its-gpus-gone"),
])
def test_keep_ahead_refuses_where_a_walk_might_not_keep_them(
        prepare: Callable[[CyclePlacement], object], ids: list[str]) -> None:
    fit = _two_nodes_running()
    prepare(fit)
    free = fit.free_gpus
    assert fit.keep_ahead(ids) is None
    assert fit.free_gpus == free  # nothing done


# Where keeping every running job but some (walked, or given up) might not leave the state a
# walk reaches: (what happened first, the running jobs, those walked or given up).
_REFUSED = [
    pytest.param(lambda fit: fit.try_place("c", 1), "ab", "b", id="something-placed-already"),
    pytest.param(lambda fit: fit.keep_all_but({"a", "b"}, {"a"}), "ab", "b", id="kept-already"),
    pytest.param(lambda fit: fit.next_cycle(in_place=True), "ab", "b", id="opened-in-place"),
    pytest.param(lambda fit: fit.bind("a", (("gone", (0,)),)), "ab", "b",
                 id="a-kept-jobs-gpus-gone"),
    pytest.param(lambda fit: fit.bind("c", (("n1", (1, 2)),)), "abc", "bc",
                 id="walked-jobs-share-gpus"),
    pytest.param(lambda fit: fit.release("b"), "ab", "a", id="told-of-other-running-jobs"),
]


@pytest.mark.parametrize(("prepare", "running", "walked"), _REFUSED)
def test_keep_all_but_refuses_where_keeping_them_ahead_might_not(
        prepare: Callable[[CyclePlacement], object], running: str, walked: str) -> None:
    fit = _two_nodes_running()
    prepare(fit)
    free = fit.free_gpus
    assert fit.keep_all_but(set(running), set(walked)) is None
    assert not fit.stay_all_but(set(running), set(walked))
    assert fit.free_gpus == free  # nothing done


def test_a_walked_job_left_bound_is_in_place_again_next_cycle() -> None:
    """Between cycles the scheduler binds or releases every job a walk moved; one neither
    (not re-placed, still bound) is back on its GPUs, taken, in a cycle in place."""
    fit = _two_nodes_running()
    assert fit.keep_all_but({"a", "b"}, {"b"}) == {"a": (("n0", (0, 1, 2)),)}
    fit.next_cycle(in_place=True)
    assert fit.free_gpus == 3
    assert fit.try_place("c", 3) is None  # b's GPUs are not to be taken in place


def test_keep_all_but_walks_a_job_whose_gpus_are_gone_as_keep_ahead_does() -> None:
    fits = _two_nodes_running(), _two_nodes_running()
    for fit in fits:
        fit.bind("b", (("gone", (0,)),))
    assert fits[0].keep_all_but({"a", "b"}, {"b"}) == fits[1].keep_ahead(["a"])
    assert fits[0].free_gpus == fits[1].free_gpus == 5
    # Placed anywhere, as a new job: here the tightest node, a's.
    assert fits[0].try_place("b", 1) == fits[1].try_place("b", 1) == (("n0", (3,)),)


def test_keep_ahead_refuses_on_a_cluster_of_several_gpu_types() -> None:
    cl = ClusterSpec(name="c", nodes=(NodeSpec(node_id="n0", switch_id="s", gpus=4, gpu_type="A"),
                                      NodeSpec(node_id="n1", switch_id="s", gpus=4, gpu_type="B")))
    fit = CyclePlacement(cl, previous={"a": (("n0", (0, 1)),)})
    assert fit.keep_ahead(["a"]) is None
    assert fit.try_place("a", 2) == (("n0", (0, 1)),)


def test_keeping_ahead_jobs_that_share_gpus_is_refused_loudly() -> None:
    """Co-located jobs are the caller's to leave out: the second cannot get its GPUs back."""
    fit = CyclePlacement(ClusterSpec.uniform(1, 1, 4),
                         previous={"a": (("n0", (0, 1)),), "b": (("n0", (0, 1)),)})
    with pytest.raises(ValueError, match="job b cannot be kept ahead"):
        fit.keep_ahead(["a", "b"])


def _counted_running(cl: ClusterSpec, gangs: list[int]
                     ) -> tuple[ClusterSpec, dict[str, GpuSlots]]:
    """`cl` with one GPU type (as counts need) and the gangs that fit placed on it, where."""
    cl = ClusterSpec(name="one-type", nodes=tuple(n.model_copy(update={"gpu_type": "A"})
                                                  for n in cl.nodes))
    running: dict[str, GpuSlots] = {}
    first = CyclePlacement(cl, "count")
    for i, g in enumerate(gangs):
        slots = first.try_place(f"r{i}", g)
        if slots is not None:
            running[f"r{i}"] = slots
    return cl, running


@settings(max_examples=200, deadline=None)
@given(cl=clusters(), gangs=st.lists(st.integers(1, 8), min_size=1, max_size=10),
       walked=st.lists(st.booleans(), min_size=10, max_size=10),
       stays=st.lists(st.sampled_from(["stays", "stops", "miscounted"]), min_size=10,
                      max_size=10),
       later=st.lists(st.integers(1, 8), max_size=6), force_hold=st.booleans())
def test_let_go_after_keep_all_but_is_let_go_from_held_gpus(
        cl: ClusterSpec, gangs: list[int], walked: list[bool], stays: list[str],
        later: list[int], force_hold: bool) -> None:
    """A walk where counts decide may let go of running jobs before `keep_all_but` has held
    the walked ones' GPUs (`CyclePlacement._pending`): the state is as where they were held
    first (the cycle asked before it let go), whichever of them stay (one counted wrong is
    placed anew), and what is placed next lands alike."""
    cl, running = _counted_running(cl, gangs)
    walk = {j for i, j in enumerate(sorted(running)) if walked[i]}
    staying = {j: sum(len(g) for _, g in running[j]) + (stays[i] == "miscounted")
               for i, j in enumerate(sorted(walk)) if stays[i] != "stops"}
    fits = [CyclePlacement(cl, "count", running) for _ in range(2)]
    for fit, hold in zip(fits, (force_hold, True), strict=True):
        assert fit.keep_all_but(running.keys(), walk) is not None
        if hold:
            fit.largest_block()  # uses the cycle: the walked jobs' GPUs are held now
    kept = [fit.let_go(staying) for fit in fits]
    assert kept[0] == kept[1]
    assert kept[0].keys() == {j for j in staying if sum(
        len(g) for _, g in running[j]) == staying[j]}
    for fit in fits[1:]:
        assert (fit.free_gpus, fit.largest_block()) == (fits[0].free_gpus,
                                                        fits[0].largest_block())
    for i, g in enumerate(later):
        assert fits[0].try_place(f"x{i}", g) == fits[1].try_place(f"x{i}", g)
    for j in sorted(walk - kept[0].keys()):  # given up, or placed anew
        g = staying.get(j, 1)
        assert fits[0].try_place(j, g) == fits[1].try_place(j, g)


def _two_nodes_counted() -> CyclePlacement:
    """`_two_nodes_running` under the `count` scheme, where counts decide."""
    return CyclePlacement(ClusterSpec.uniform(1, 2, 4), "count", index_from=1,
                          previous={"a": (("n0", (0, 1, 2)),), "b": (("n1", (0, 1)),)})


@pytest.mark.parametrize(("prepare", "running", "given_up"), [
    *_REFUSED, pytest.param(lambda fit: fit.largest_block(), "ab", "b", id="used-already")])
def test_stay_but_refuses_where_the_walk_might_not_leave_that_state(
        prepare: Callable[[CyclePlacement], object], running: str, given_up: str) -> None:
    fit = _two_nodes_counted()
    prepare(fit)
    free, in_place = fit.free_gpus, fit.in_place
    assert not fit.stay_but(set(running), set(given_up))
    assert (fit.free_gpus, fit.in_place) == (free, in_place)  # nothing done


def test_stay_but_frees_the_given_up_and_goes_on_in_place() -> None:
    fit = _two_nodes_counted()
    assert fit.idle_gpus == 3
    assert fit.stay_but({"a", "b"}, {"b"})
    assert fit.in_place and fit.free_gpus == 5  # n0's last GPU, all of n1
    with pytest.raises(ValueError, match="runs in place"):
        fit.try_place("a", 3)  # a staying job is not placed again
    assert fit.try_place("x", 4) == (("n1", (0, 1, 2, 3)),)  # b's GPUs, free and unheld
    assert fit.free_gpus == 1


@settings(max_examples=200, deadline=None)
@given(cl=clusters(), gangs=st.lists(st.integers(1, 8), min_size=1, max_size=10),
       gone=st.lists(st.booleans(), min_size=10, max_size=10),
       later=st.lists(st.integers(1, 8), max_size=6))
def test_stay_but_is_keep_all_but_then_let_go(
        cl: ClusterSpec, gangs: list[int], gone: list[bool], later: list[int]) -> None:
    """Where counts decide, a walk that knows its given-up jobs before it starts reaches the
    state of one that kept every running job but the walked ones and then let go of those
    given up: the same free GPUs, and what is placed next lands alike."""
    cl, running = _counted_running(cl, gangs)
    given_up = {j for i, j in enumerate(sorted(running)) if gone[i]}
    staying = {j: sum(len(g) for _, g in slots) for j, slots in running.items()
               if j not in given_up}
    fits = [CyclePlacement(cl, "count", running) for _ in range(2)]
    assert fits[0].stay_but(running.keys(), given_up)
    assert fits[1].keep_all_but(running.keys(), set(running)) is not None
    assert fits[1].let_go(staying) == {j: running[j] for j in staying}
    assert fits[0].free_gpus == fits[1].free_gpus
    assert fits[0].largest_block() == fits[1].largest_block()
    for i, g in enumerate(later):
        assert fits[0].try_place(f"x{i}", g) == fits[1].try_place(f"x{i}", g)
