"""CyclePlacement: one cycle's reservation state (domain/placement.py).

Cluster states are built exactly with `busy(...)`: every busy block is a running job from the
previous cycle that is re-placed first, so it keeps exactly the GPUs named.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

import pytest

from domain.placement import SCHEMES, CyclePlacement
from domain.topology import Topology
from schemas.cluster import ClusterSpec, NodeSpec
from schemas.events import GpuSlots
from tests.builders import cluster

STICKY = tuple(s for s in SCHEMES if s != "yarn")  # yarn re-packs every cycle by design

Gpu = tuple[str, int]


def busy(cl: ClusterSpec, scheme: str = "consolidated",
         used: Mapping[str, tuple[int, ...]] | None = None,
         previous: Mapping[str, GpuSlots] | None = None) -> CyclePlacement:
    """A placement state where `used[node]` GPUs are taken by filler jobs (re-placed first).

    `previous` adds running jobs that are *not* re-placed yet (their GPUs are held, not taken).
    """
    fillers = {f"busy-{node}": ((node, gpus),) for node, gpus in (used or {}).items() if gpus}
    fit = CyclePlacement(cl, scheme, {**fillers, **(previous or {})})  # type: ignore[arg-type]
    for jid, slots in fillers.items():
        assert fit.try_place(jid, len(slots[0][1])) == slots
    return fit


def gpus_of(slots: GpuSlots) -> list[Gpu]:
    return [(node, i) for node, idx in slots for i in idx]


def nodes_of(slots: GpuSlots) -> list[str]:
    return [node for node, _ in slots]


def switch_of(cl: ClusterSpec, node: str) -> str:
    return cl.node(node).switch_id


# --------------------------------------------------------------------------------------------
# consolidated scheme
# --------------------------------------------------------------------------------------------

# 3 nodes × 4 GPUs, one switch; n0 has 3 free, n1 has 2 free, n2 has 4 free.
UNEVEN = {"n0": (0,), "n1": (0, 1)}


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        pytest.param(1, (("n1", (2,)),), id="1gpu-tightest-is-n1-with-2-free"),
        pytest.param(2, (("n1", (2, 3)),), id="2gpus-exactly-fill-n1"),
        pytest.param(3, (("n0", (1, 2, 3)),), id="3gpus-n0-is-the-only-tight-fit"),
        pytest.param(4, (("n2", (0, 1, 2, 3)),), id="4gpus-need-the-empty-node"),
    ],
)
def test_consolidated_small_job_goes_on_the_tightest_single_node(
    gpus: int, expected: GpuSlots
) -> None:
    fit = busy(cluster(3, 4), used=UNEVEN)
    assert fit.try_place("j", gpus) == expected


@pytest.mark.parametrize(
    ("nodes", "used", "gpus", "whole", "remainder"),
    [
        # whole nodes n0, n2 are free; remainder 2 goes on n1 (2 free: tighter than n2's 4).
        pytest.param(3, {"n1": (0, 1)}, 6, ["n0"], ("n1", 2), id="6gpus=1-whole+2-on-tightest"),
        pytest.param(3, {}, 8, ["n0", "n1"], None, id="8gpus=2-whole-nodes"),
        pytest.param(3, {}, 12, ["n0", "n1", "n2"], None, id="12gpus=3-whole-nodes"),
        pytest.param(3, {"n0": (3,)}, 9, ["n1", "n2"], ("n0", 1), id="9gpus=2-whole+1"),
    ],
)
def test_consolidated_large_job_takes_whole_nodes_plus_one_remainder(
    nodes: int, used: dict[str, tuple[int, ...]], gpus: int, whole: list[str],
    remainder: tuple[str, int] | None,
) -> None:
    cl = cluster(nodes, 4)
    slots = busy(cl, used=used).try_place("j", gpus)
    assert slots is not None
    full = [node for node, idx in slots if len(idx) == 4]
    part = [(node, len(idx)) for node, idx in slots if len(idx) != 4]
    assert sorted(full) == whole
    assert part == ([remainder] if remainder else [])
    assert len(gpus_of(slots)) == gpus


# Two switches: s0 = {n0, n1}, s1 = {n2, n3}, 4 GPUs each.
TWO_SWITCHES = cluster(4, 4, switches=2)


@pytest.mark.parametrize(
    ("used", "gpus", "expected_switch"),
    [
        pytest.param({"n1": (0, 1, 2), "n2": (0,), "n3": (0,)}, 5, "s0", id="5=n0+1-on-n1"),
        pytest.param({"n0": (0,), "n1": (0,)}, 7, "s1", id="s0-has-no-whole-node-so-s1"),
        pytest.param({}, 8, "s0", id="8-on-an-empty-cluster-first-switch"),
    ],
)
def test_consolidated_multi_node_job_stays_under_one_switch(
    used: dict[str, tuple[int, ...]], gpus: int, expected_switch: str
) -> None:
    slots = busy(TWO_SWITCHES, used=used).try_place("j", gpus)
    assert slots is not None
    assert {switch_of(TWO_SWITCHES, n) for n in nodes_of(slots)} == {expected_switch}
    assert len(gpus_of(slots)) == gpus


@pytest.mark.parametrize(
    ("cl", "used", "gpus"),
    [
        # 4 free (2 + 2) but no node has 3.
        pytest.param(cluster(2, 4), {"n0": (0, 1), "n1": (0, 1)}, 3, id="fragmented-nodes"),
        # 11 free: s0 = n0 whole + 1 on n1 (remainder 2 does not fit), s1 = 3 + 3 (no whole node).
        pytest.param(TWO_SWITCHES, {"n1": (0, 1, 2), "n2": (0,), "n3": (0,)}, 6,
                     id="fits-only-across-switches"),
        # 8 free (4 + 2 + 2): the only whole node's switch-mate has 2, the remainder needs 3.
        pytest.param(TWO_SWITCHES, {"n1": (0, 1), "n2": (0, 1), "n3": (0, 1, 2, 3)}, 7,
                     id="no-switch-has-whole+remainder"),
    ],
)
def test_consolidated_returns_none_although_enough_gpus_are_free_in_total(
    cl: ClusterSpec, used: dict[str, tuple[int, ...]], gpus: int
) -> None:
    fit = busy(cl, used=used)
    before = fit.free_gpus
    assert before >= gpus
    assert fit.try_place("j", gpus) is None
    assert fit.free_gpus == before  # a failed attempt reserves nothing
    assert "j" not in fit.placed


@pytest.mark.parametrize(
    ("used", "gpus", "fragments"),
    [
        pytest.param({"n0": (0, 1), "n1": (0, 1)}, 3, ["3 GPUs", "4 free", "is 2"],
                     id="fragmented-largest-block-2"),
        pytest.param({"n0": (0, 1, 2), "n1": (0,)}, 4, ["4 GPUs", "4 free", "is 3"],
                     id="fragmented-largest-block-3"),
        pytest.param({"n0": (0, 1, 2), "n1": (0, 1, 2)}, 3, ["needs 3 GPUs, 2 free"],
                     id="not-enough-gpus-at-all"),
    ],
)
def test_explain_names_the_largest_free_block(
    used: dict[str, tuple[int, ...]], gpus: int, fragments: list[str]
) -> None:
    fit = busy(cluster(2, 4), used=used)
    assert fit.try_place("j", gpus) is None
    text = fit.explain(gpus)
    for frag in fragments:
        assert frag in text, text


def test_largest_block_tracks_reservations() -> None:
    fit = busy(cluster(2, 4), used={"n0": (0,)})
    assert fit.largest_block() == 4
    fit.try_place("a", 4)  # takes n1
    assert fit.largest_block() == 3
    fit.try_place("b", 3)
    assert fit.largest_block() == 0


@pytest.mark.parametrize("gpus", [0, -1], ids=["zero", "negative"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_non_positive_gang_is_never_placed(scheme: str, gpus: int) -> None:
    fit = CyclePlacement(cluster(1, 4), scheme)  # type: ignore[arg-type]
    assert fit.try_place("j", gpus) is None
    assert fit.free_gpus == 4


# --------------------------------------------------------------------------------------------
# count scheme
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("cl", "used", "gpus", "max_nodes", "switches"),
    [
        pytest.param(cluster(2, 4), {"n0": (0, 1), "n1": (0, 1)}, 3, 2, None,
                     id="3-over-2+2"),
        pytest.param(cluster(2, 4), {"n0": (0, 1), "n1": (0, 1)}, 4, 2, None,
                     id="4-over-2+2"),
        pytest.param(TWO_SWITCHES, {"n1": (0, 1, 2), "n2": (0,), "n3": (0,)}, 6, 2, None,
                     id="6-where-consolidated-fails"),
        # s0 has 2 free, s1 has 4 free: a 3-GPU gang fits in s1 alone, so it stays there.
        pytest.param(TWO_SWITCHES, {"n0": (0, 1, 2), "n1": (0, 1, 2), "n2": (0, 1),
                                    "n3": (0, 1)}, 3, 2, {"s1"}, id="prefers-one-switch"),
        pytest.param(TWO_SWITCHES, {"n0": (0, 1, 2), "n1": (0, 1, 2), "n2": (0, 1),
                                    "n3": (0, 1)}, 6, 4, {"s0", "s1"}, id="spans-switches"),
    ],
)
def test_count_places_whenever_enough_gpus_are_free(
    cl: ClusterSpec, used: dict[str, tuple[int, ...]], gpus: int, max_nodes: int,
    switches: set[str] | None,
) -> None:
    consolidated = busy(cl, used=used)
    fit = busy(cl, "count", used=used)
    assert consolidated.try_place("j", gpus) is None  # the case only counting can serve
    slots = fit.try_place("j", gpus)
    assert slots is not None
    taken = gpus_of(slots)
    assert len(taken) == len(set(taken)) == gpus
    assert not {(n, i) for n, idx in used.items() for i in idx} & set(taken)
    assert len(nodes_of(slots)) <= max_nodes
    if switches is not None:
        assert {switch_of(cl, n) for n in nodes_of(slots)} == switches


@pytest.mark.parametrize(
    ("used", "gpus", "expected"),
    [
        pytest.param(UNEVEN, 2, (("n1", (2, 3)),), id="tightest-single-node"),
        pytest.param(UNEVEN, 4, (("n2", (0, 1, 2, 3)),), id="empty-node-not-spread"),
        pytest.param({}, 8, (("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3))),
                     id="whole-nodes-when-possible"),
    ],
)
def test_count_still_consolidates_when_it_can(
    used: dict[str, tuple[int, ...]], gpus: int, expected: GpuSlots
) -> None:
    assert busy(cluster(3, 4), "count", used=used).try_place("j", gpus) == expected


@pytest.mark.parametrize("index_from", [1, 10**9], ids=["indexed", "scanned"])
@pytest.mark.parametrize(("used", "gpus", "expected"), [
    pytest.param({"n0": (0, 1), "n1": (0, 1), "n2": (0, 1), "n3": (0, 1)}, 3,
                 (("n0", (2, 3)), ("n1", (2,))), id="tied-switches-the-first"),
    pytest.param({"n0": (0, 1, 2), "n1": (0, 1), "n2": (0, 1), "n3": (0, 1)}, 3,
                 (("n2", (2, 3)), ("n3", (2,))), id="the-fuller-switch"),
    pytest.param({"n0": (0, 1), "n1": (0, 1, 2), "n2": (0, 1), "n3": (0, 1, 2)}, 5,
                 (("n0", (2, 3)), ("n2", (2, 3)), ("n1", (3,))), id="no-switch-alone"),
    pytest.param({"n0": (0, 1, 2), "n1": (0, 1, 2), "n2": (0, 1, 2), "n3": (0, 1, 2)}, 5,
                 None, id="too-few-anywhere"),
])
def test_count_spreads_over_the_fullest_switch_read_by_index_or_by_scan(
        used: dict[str, tuple[int, ...]], gpus: int, expected: GpuSlots | None,
        index_from: int) -> None:
    fillers = {f"busy-{node}": ((node, taken),) for node, taken in used.items()}
    fit = CyclePlacement(TWO_SWITCHES, "count", fillers, index_from=index_from)
    for job, slots in fillers.items():
        assert fit.try_place(job, len(slots[0][1])) == slots
    assert fit.try_place("j", gpus) == expected


def test_count_refuses_more_than_the_free_gpus() -> None:
    fit = busy(cluster(2, 4), "count", used={"n0": (0, 1), "n1": (0, 1)})
    assert fit.try_place("j", 5) is None
    assert fit.free_gpus == 4
    assert fit.explain(5) == "needs 5 GPUs, 4 free"


# --------------------------------------------------------------------------------------------
# sticky placement of running jobs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", STICKY)
@pytest.mark.parametrize(
    ("nodes", "mine"),
    [
        # Not the lowest indices and not the tightest node: a fresh placement would differ.
        pytest.param(2, (("n1", (1, 3)),), id="odd-gpus-on-n1"),
        pytest.param(3, (("n2", (0,)), ("n0", (2, 3))), id="spread-gang"),
        pytest.param(3, (("n1", (0, 1, 2, 3)), ("n2", (0, 1, 2, 3))), id="two-whole-nodes"),
    ],
)
def test_running_job_replaced_first_keeps_exactly_its_gpus(
    scheme: str, nodes: int, mine: GpuSlots
) -> None:
    fit = CyclePlacement(cluster(nodes, 4), scheme, {"r": mine})  # type: ignore[arg-type]
    total = fit.free_gpus
    assert fit.try_place("r", len(gpus_of(mine))) == mine
    assert fit.free_gpus == total - len(gpus_of(mine))


# Buddy blocks are aligned: the 2-GPU job cannot use n0's unheld GPUs 0 and 3 and goes to
# n1, so the 3-GPU job must displace r; aligned blocks trade this for no fragmentation.
@pytest.mark.parametrize("scheme", [s for s in STICKY if s != "buddy"])
def test_running_job_keeps_its_gpus_after_unrelated_new_jobs(scheme: str) -> None:
    mine = (("n0", (1, 2)),)
    fit = CyclePlacement(cluster(2, 4), scheme, {"r": mine})  # type: ignore[arg-type]
    a = fit.try_place("a", 2)
    b = fit.try_place("b", 3)
    assert a is not None and b is not None
    assert fit.try_place("r", 2) == mine


@pytest.mark.parametrize("scheme", STICKY)
@pytest.mark.parametrize(
    ("nodes", "previous", "gpus"),
    [
        pytest.param(1, {"r": (("n0", (0, 1)),)}, 2, id="same-node-other-half"),
        pytest.param(2, {"r": (("n0", (0, 1, 2)),)}, 1, id="1gpu-takes-the-unheld-one"),
        pytest.param(2, {"r": (("n0", (0, 1, 2)),)}, 2, id="2gpus-move-to-the-other-node"),
        pytest.param(2, {"r": (("n0", (1,)),), "s": (("n1", (2,)),)}, 3, id="two-holders"),
        pytest.param(3, {"r": (("n0", (0, 1, 2, 3)),)}, 6, id="multi-node-avoids-held-node"),
        pytest.param(3, {"r": (("n1", (0, 1)),)}, 6, id="remainder-avoids-held-gpus"),
    ],
)
def test_new_job_avoids_gpus_held_by_running_jobs_when_others_are_free(
    scheme: str, nodes: int, previous: dict[str, GpuSlots], gpus: int
) -> None:
    fit = CyclePlacement(cluster(nodes, 4), scheme, previous)  # type: ignore[arg-type]
    slots = fit.try_place("new", gpus)
    assert slots is not None
    held = {g for s in previous.values() for g in gpus_of(s)}
    assert not held & set(gpus_of(slots))
    for jid, mine in previous.items():  # so every running job keeps its place
        assert fit.try_place(jid, len(gpus_of(mine))) == mine


def test_count_spread_avoids_held_gpus_when_unheld_ones_suffice() -> None:
    # n0: GPUs 2,3 free but held by running job r; n1: 2 free; n2: 1 free (all unheld).
    fit = busy(cluster(3, 4), "count", used={"n0": (0, 1), "n1": (0, 1), "n2": (0, 1, 2)},
               previous={"r": (("n0", (2, 3)),)})
    slots = fit.try_place("new", 3)
    assert slots is not None
    # n1 (2) + n2 (1) is as few nodes as n1 + n0 and displaces nobody.
    assert ("n0", 2) not in gpus_of(slots) and ("n0", 3) not in gpus_of(slots)


def test_consolidated_new_job_displaces_a_running_one_only_when_it_must() -> None:
    mine = (("n0", (0, 1)),)
    fit = CyclePlacement(cluster(2, 4), "consolidated", {"r": mine})
    y = fit.try_place("y", 3)  # n0 has only 2 unheld GPUs, so y goes to n1
    x = fit.try_place("x", 3)  # only n0 has 3 free: it must take one of r's GPUs
    assert y is not None and x is not None
    assert nodes_of(y) == ["n1"] and nodes_of(x) == ["n0"]
    assert set(gpus_of(mine)) & set(gpus_of(x))
    assert fit.try_place("r", 2) is None  # 1 + 1 free, no node holds 2
    assert fit.free_gpus == 2


def test_count_new_job_spreads_rather_than_displace_a_running_one() -> None:
    mine = (("n0", (0, 1)),)
    fit = CyclePlacement(cluster(2, 4), "count", {"r": mine})
    y = fit.try_place("y", 3)
    x = fit.try_place("x", 3)  # n0's 2 unheld GPUs + n1's last one: nobody is displaced
    assert y is not None and x is not None
    assert not set(gpus_of(mine)) & (set(gpus_of(x)) | set(gpus_of(y)))
    assert fit.try_place("r", 2) == mine  # r keeps exactly its GPUs
    assert fit.free_gpus == 0


def two_types() -> ClusterSpec:
    return ClusterSpec(name="two-types", nodes=(
        NodeSpec(node_id="a0", switch_id="s0", gpus=4, gpu_type="A100"),
        NodeSpec(node_id="v0", switch_id="s0", gpus=4, gpu_type="V100")))


def _shared() -> CyclePlacement:
    both = (("n0", (0, 1)),)  # two jobs on the same GPUs (co-located)
    return CyclePlacement(cluster(2, 4), "count", {"a": both, "b": both})


def _in_place() -> CyclePlacement:
    fit = CyclePlacement(cluster(2, 4), "count")
    fit.next_cycle(in_place=True)
    return fit


@pytest.mark.parametrize(("make", "decide"), [
    (lambda: CyclePlacement(cluster(2, 4), "count"), True),
    (lambda: CyclePlacement(cluster(2, 4), "consolidated"), False),
    (lambda: CyclePlacement(cluster(2, 4), "count", cordoned={"n1"}), False),
    (lambda: CyclePlacement(two_types(), "count"), False),
    (_shared, False),
    (_in_place, False),
], ids=["count", "consolidated", "cordoned", "two-types", "shared-gpus", "in-place"])
def test_counts_decide_only_where_any_free_gpu_may_take_any_gang(
        make: Callable[[], CyclePlacement], decide: bool) -> None:
    assert make().counts_decide is decide


def test_let_go_keeps_the_staying_and_frees_the_others_gpus_unheld() -> None:
    previous = {"a": (("n0", (0, 1)),), "b": (("n0", (2, 3)),), "c": (("n1", (0, 1)),)}
    fit = CyclePlacement(cluster(2, 4), "count", previous)
    kept = fit.let_go({"a": 2, "c": 2})
    assert kept == {"a": previous["a"], "c": previous["c"]}
    assert fit.free_gpus == 4  # b's two GPUs and n1's two idle ones
    # b's GPUs are no longer held for it: a new job takes them without displacing anyone,
    # tightest node first, and b is not placed again this cycle.
    assert fit.try_place("x", 2) == (("n0", (2, 3)),)
    assert fit.try_place("b", 2) == (("n1", (2, 3)),)
    assert fit.free_gpus == 0


def test_let_go_leaves_a_running_job_whose_gpus_are_gone_to_be_placed_anew() -> None:
    fit = CyclePlacement(cluster(1, 4), "count", {"lost": (("gone", (0,)),)})
    assert fit.let_go({"lost": 1}) == {}
    assert fit.free_gpus == 4
    assert fit.try_place("lost", 1) == (("n0", (0,)),)


def test_running_job_with_displaced_gpus_moves_to_a_free_node() -> None:
    previous = {"r": (("n0", (0, 1)),), "q": (("n1", (0, 1, 2, 3)),)}
    fit = CyclePlacement(cluster(2, 4), "consolidated", previous)
    x = fit.try_place("x", 4)  # n0 and n1 both have held GPUs; tie → n0
    assert x == (("n0", (0, 1, 2, 3)),)
    r = fit.try_place("r", 2)
    assert r is not None and r != previous["r"]
    assert not set(gpus_of(r)) & set(gpus_of(x))
    assert fit.try_place("q", 4) is None  # r took two of q's GPUs


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    ("mine", "gpus"),
    [
        pytest.param((("ghost", (0, 1)),), 2, id="unknown-node"),
        pytest.param((("n0", (3, 4)),), 2, id="gpu-index-out-of-range"),
        pytest.param((("n1", (0, 1)),), 3, id="different-gang-size"),
    ],
)
def test_stale_previous_placement_is_replaced_by_a_fresh_one(
    scheme: str, mine: GpuSlots, gpus: int
) -> None:
    fit = CyclePlacement(cluster(2, 4), scheme, {"r": mine})  # type: ignore[arg-type]
    slots = fit.try_place("r", gpus)
    assert slots is not None and slots != mine
    assert len(gpus_of(slots)) == gpus
    assert all(0 <= i < 4 and n in ("n0", "n1") for n, i in gpus_of(slots))


def test_unknown_scheme_raises_value_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="packed") as exc:
        CyclePlacement(cluster(), "packed")  # type: ignore[arg-type]
    for scheme in ("consolidated", "count"):
        assert scheme in str(exc.value)


# --------------------------------------------------------------------------------------------
# properties over random cycles (seeded, so failures reproduce)
# --------------------------------------------------------------------------------------------

def random_cluster(rng: random.Random) -> ClusterSpec:
    switches = rng.randint(1, 3)
    return cluster(switches * rng.randint(1, 3), rng.choice((1, 2, 4, 8)), switches)


def random_previous(rng: random.Random, cl: ClusterSpec, scheme: str) -> dict[str, GpuSlots]:
    """What ran last cycle: a valid random placement from a fresh cycle."""
    fit = CyclePlacement(cl, scheme)  # type: ignore[arg-type]
    for k in range(rng.randint(0, 8)):
        fit.try_place(f"r{k}", rng.randint(1, cl.total_gpus))
    return dict(fit.placed)


def random_ops(rng: random.Random, cl: ClusterSpec,
               previous: dict[str, GpuSlots]) -> list[tuple[str, int]]:
    """A walk: some running jobs (own size, rarely another), new jobs, in random order."""
    ops = [(jid, len(gpus_of(s)) if rng.random() < 0.9 else rng.randint(1, cl.total_gpus))
           for jid, s in previous.items() if rng.random() < 0.8]
    ops += [(f"new{k}", rng.randint(1, cl.total_gpus)) for k in range(rng.randint(0, 8))]
    rng.shuffle(ops)
    return ops


SEEDS = range(300)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_gpu_is_handed_out_twice_and_free_count_is_exact(scheme: str) -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        cl = random_cluster(rng)
        size = {n.node_id: n.gpus for n in cl.nodes}
        biggest = max(size.values())
        previous = random_previous(rng, cl, scheme)
        fit = CyclePlacement(cl, scheme, previous)  # type: ignore[arg-type]
        taken: set[Gpu] = set()
        placed: dict[str, GpuSlots] = {}
        for jid, g in random_ops(rng, cl, previous):
            free_before = fit.free_gpus
            own_free = jid in previous and g == len(gpus_of(previous[jid])) and not (
                set(gpus_of(previous[jid])) & taken)
            slots = fit.try_place(jid, g)
            ctx = f"seed={seed} scheme={scheme} job={jid} gpus={g} slots={slots}"
            if slots is None:
                assert fit.free_gpus == free_before, ctx
                assert not own_free, ctx  # sticky: its own GPUs were all free
                if scheme == "count":
                    assert g > free_before, ctx
                continue
            got = gpus_of(slots)
            assert len(got) == len(set(got)) == g, ctx
            assert all(n in size and 0 <= i < size[n] for n, i in got), ctx
            assert not taken & set(got), ctx
            if own_free and scheme != "yarn":  # yarn re-packs: previous GPUs mean nothing
                assert slots == previous[jid], ctx
            elif scheme in ("consolidated", "yarn"):
                assert_consolidated(cl, slots, g, biggest, ctx)
            taken |= set(got)
            placed[jid] = slots
            assert fit.free_gpus == cl.total_gpus - len(taken), ctx
        assert fit.placed == placed


@pytest.mark.parametrize("index_from", [1, 10**9], ids=["indexed", "scanned"])
@pytest.mark.parametrize("scheme", STICKY)
def test_a_job_that_displaces_nobody_lands_as_if_running_jobs_were_already_placed(
        scheme: str, index_from: int) -> None:
    """Whether the running jobs are still held (a walk has not reached them) or already on
    their GPUs (a cycle opened in place), new gangs that fit beside them land on the same
    GPUs; the first that would displace one (or fit nowhere) fits nowhere in place."""
    for seed in SEEDS:
        rng = random.Random(seed)
        cl = random_cluster(rng)
        previous = random_previous(rng, cl, scheme)
        held = {g for slots in previous.values() for g in gpus_of(slots)}
        walk = CyclePlacement(cl, scheme, previous, index_from=index_from)  # type: ignore[arg-type]
        ahead = CyclePlacement(cl, scheme, previous, index_from=index_from)  # type: ignore[arg-type]
        ahead.next_cycle(in_place=True)
        for k in range(rng.randint(1, 8)):
            g = rng.randint(1, cl.total_gpus)
            a, b = walk.try_place(f"new{k}", g), ahead.try_place(f"new{k}", g)
            ctx = f"seed={seed} scheme={scheme} new{k} gpus={g} walk={a} in place={b}"
            if a is None or held & set(gpus_of(a)):
                assert b is None, ctx
                break
            assert a == b, ctx


def assert_consolidated(cl: ClusterSpec, slots: GpuSlots, g: int, biggest: int, ctx: str) -> None:
    if g <= biggest:
        assert len(slots) == 1, ctx
        return
    assert len({switch_of(cl, n) for n in nodes_of(slots)}) == 1, ctx
    partial = [n for n, idx in slots if len(idx) != cl.node(n).gpus]
    assert len(partial) <= 1, ctx
    assert len(set(nodes_of(slots))) == len(slots), ctx


def fits_after(cl: ClusterSpec, scheme: str, previous: dict[str, GpuSlots],
               ops: list[tuple[str, int]], g: int) -> bool:
    fit = CyclePlacement(cl, scheme, previous)  # type: ignore[arg-type]
    for jid, k in ops:
        fit.try_place(jid, k)
    assert fit.monotone
    return fit.try_place("probe", g) is not None


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "buddy"])  # promises none
def test_monotone_if_g_does_not_fit_no_larger_gang_fits(scheme: str) -> None:
    for seed in range(150):
        rng = random.Random(seed)
        cl = random_cluster(rng)
        previous = random_previous(rng, cl, scheme)
        ops = random_ops(rng, cl, previous)
        fits = [fits_after(cl, scheme, previous, ops, g) for g in range(1, cl.total_gpus + 2)]
        first_unfit = fits.index(False)  # total + 1 never fits
        assert not any(fits[first_unfit:]), (
            f"seed={seed} {scheme}: gang {first_unfit + 1} does not fit but "
            f"{[g + 1 for g, ok in enumerate(fits) if ok and g > first_unfit]} do")


def hetero() -> ClusterSpec:
    """Switch s0: three 4-GPU nodes; switch s1: one 8-GPU node."""
    nodes = [NodeSpec(node_id=f"a{i}", switch_id="s0", gpus=4) for i in range(3)]
    nodes.append(NodeSpec(node_id="b0", switch_id="s1", gpus=8))
    return ClusterSpec(nodes=tuple(nodes))


def test_mixed_node_sizes_consolidate_per_switch_and_disable_skipping() -> None:
    fit = CyclePlacement(hetero(), "consolidated")
    assert not fit.monotone  # mixed sizes: a failed gang says nothing about larger ones
    assert fit.try_place("big", 8) == (("b0", tuple(range(8))),)
    # No 8-GPU node is free, but switch s0 (4-GPU nodes only) takes 5 as a node + 1 GPU.
    five = fit.try_place("five", 5)
    assert five is not None and {n for n, _ in five} <= {"a0", "a1", "a2"}
    assert sorted(len(g) for _, g in five) == [1, 4]
    assert CyclePlacement(cluster(2, 4), "count").monotone


def test_switch_of_gpu_less_nodes_does_not_crash_multi_node_placement() -> None:
    cl = ClusterSpec(nodes=(
        NodeSpec(node_id="cpu0", switch_id="s0", gpus=0),
        NodeSpec(node_id="g0", switch_id="s1", gpus=4),
        NodeSpec(node_id="g1", switch_id="s1", gpus=4),
    ))
    assert CyclePlacement(cl).try_place("j", 6) == (("g0", (0, 1, 2, 3)), ("g1", (0, 1)))


def test_yarn_repacks_first_fit_from_an_empty_cluster() -> None:
    # Muri's and Tiresias' simulators re-place every job each event, first fit in node order:
    # a running job's old GPUs mean nothing, and nobody's GPUs are held.
    fit = CyclePlacement(cluster(3, 4), "yarn", {"r": (("n2", (0, 1)),)})
    assert fit.try_place("a", 3) == (("n0", (0, 1, 2)),)
    assert fit.try_place("r", 2) == (("n1", (0, 1)),)  # first node with 2 free, not its own
    assert fit.try_place("b", 1) == (("n0", (3,)),)  # first fit, not the tightest node
    # 6 GPUs: the first whole node (n2) plus the first node with 2 free for the remainder.
    assert fit.try_place("c", 6) == (("n2", (0, 1, 2, 3)), ("n1", (2, 3)))
    assert fit.try_place("d", 2) is None


@pytest.mark.parametrize("scheme", SCHEMES)
def test_within_restricts_a_gang_to_the_named_nodes(scheme: str) -> None:
    cl = cluster(3, 4)
    names = [n.node_id for n in cl.nodes]
    fit = CyclePlacement(cl, scheme)  # type: ignore[arg-type]
    slots = fit.try_place("a", 2, within={names[2]})
    assert slots is not None and {node for node, _ in slots} == {names[2]}
    assert fit.try_place("b", 4, within={names[2]}) is None  # only 2 left there
    both = fit.try_place("c", 6, within={names[0], names[2]})
    assert both is not None and {node for node, _ in both} <= {names[0], names[2]}


def test_within_does_not_give_a_job_back_gpus_outside_the_named_nodes() -> None:
    cl = cluster(2, 4)
    names = [n.node_id for n in cl.nodes]
    fit = CyclePlacement(cl, "count", {"a": ((names[0], (0,)),)})
    slots = fit.try_place("a", 1, within={names[1]})
    assert slots is not None and slots[0][0] == names[1]


@pytest.mark.parametrize(("busy_gpus", "gpus", "expected"), [
    ({0: (1,)}, 2, [("n0", (2, 3))]),          # aligned: not GPUs 0 and 2
    ({0: (1,)}, 1, [("n0", (0,))]),            # the tightest node first
    ({0: (0,)}, 4, [("n1", (0, 1, 2, 3))]),    # a whole-node block elsewhere
    ({}, 8, [("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3))]),  # nodes in an aligned row
    ({0: (0,)}, 8, [("n2", (0, 1, 2, 3)), ("n3", (0, 1, 2, 3))]),  # not n1-n2
    ({0: (0,)}, 3, [("n0", (1, 2, 3))]),       # not a power of two: consolidated
])
def test_buddy_places_aligned_power_of_two_blocks(
        busy_gpus: dict[int, tuple[int, ...]], gpus: int, expected: list[Gpu]) -> None:
    cl = cluster(4, 4)
    names = [n.node_id for n in cl.nodes]
    fit = busy(cl, "buddy", {names[i]: g for i, g in busy_gpus.items()})
    slots = fit.try_place("j", gpus)
    renamed = {name: f"n{i}" for i, name in enumerate(names)}
    assert slots is not None
    assert [(renamed[node], idx) for node, idx in slots] == expected


def test_buddy_makes_no_monotone_promise() -> None:
    assert not CyclePlacement(cluster(2, 4), "buddy").monotone


def test_buddy_refuses_when_no_aligned_block_is_free() -> None:
    cl = cluster(1, 4)
    name = cl.nodes[0].node_id
    fit = busy(cl, "buddy", {name: (1, 2)})  # GPUs 0 and 3 free, but not aligned together
    assert fit.try_place("j", 2) is None
    assert fit.try_place("k", 1) is not None


# An 8-GPU node whose NVLink pairs are not neighbours by index: (0,3), (1,2), (4,7), (5,6).
LINKS = [(0, 3), (1, 2), (4, 7), (5, 6)]


@pytest.mark.parametrize(("used", "gpus", "expected"), [
    ((), 2, (0, 3)),            # an NVLink pair, not GPUs 0 and 1
    ((0,), 2, (1, 2)),          # 0's partner is alone now: the next whole pair
    ((0, 1), 2, (4, 7)),        # 3 and 2 are free but not linked to each other
    ((), 4, (0, 1, 2, 3)),      # two pairs
    ((), 1, (0,)),              # one GPU: lowest index, as without topology
])
def test_gangs_within_a_node_stay_on_nvlink_pairs(used: tuple[int, ...], gpus: int,
                                                  expected: tuple[int, ...]) -> None:
    cl = cluster(1, 8)
    node = cl.nodes[0].node_id
    topo = Topology(cl)
    topo.learn_links(node, LINKS)
    fit = CyclePlacement(topo, "consolidated", {"busy": ((node, used),)} if used else None)
    if used:
        assert fit.try_place("busy", len(used)) is not None
    slots = fit.try_place("j", gpus)
    assert slots is not None and tuple(sorted(slots[0][1])) == expected


def test_without_reported_links_placement_is_unchanged() -> None:
    cl = cluster(1, 8)
    fit = CyclePlacement(Topology(cl), "consolidated")
    slots = fit.try_place("j", 2)
    assert slots is not None and slots[0][1] == (0, 1)
