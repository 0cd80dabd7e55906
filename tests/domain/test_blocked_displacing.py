"""`CyclePlacement.blocked_displacing` (domain/placement.py): asked in a cycle opened in place,
it may say a gang is blocked only where a walk opened in full would block it too, even
displacing the running jobs named, and would still give each of them back its GPUs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from domain.placement import INDEX_FROM, CyclePlacement
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots
from tests.builders import cluster
from tests.domain.test_placement import gpus_of, random_cluster, random_previous


def in_place(cl: ClusterSpec, running: Mapping[str, GpuSlots], scheme: str = "consolidated",
             new: tuple[int, ...] = (), index_from: int = INDEX_FROM) -> CyclePlacement:
    """A cycle opened in place over `running`, having placed new gangs of the sizes `new`
    (`index_from` 1: through the free-GPU index, whose switch counts it may read)."""
    fit = CyclePlacement(cl, scheme, running, index_from=index_from)  # type: ignore[arg-type]
    fit.next_cycle(in_place=True)
    for k, g in enumerate(new):
        assert fit.try_place(f"new{k}", g) is not None
    return fit


def on(node: str, *gpus: int) -> GpuSlots:
    return ((node, gpus),)


# Two switches of two 8-GPU nodes; the "short" jobs rank ahead of the gang asked about.
RUNNING = {"short": on("n0", 0, 1, 2, 3, 4, 5),
           "long-a": on("n1", 0, 1, 2, 3), "short-2": on("n1", 4, 5),
           "long-b": on("n2", 0, 1, 2, 3, 4, 5, 6), "long-c": on("n3", 0, 1, 2, 3, 4)}


@pytest.mark.parametrize(("gpus", "victims", "new", "blocked"), [
    # Free: n0 2, n1 2, n2 1, n3 3 (8 in all); a victim's GPUs count as room.
    pytest.param(6, [], (), True, id="no-node-has-room"),
    pytest.param(3, [], (), False, id="a-node-has-room-beside-them"),
    pytest.param(7, ["long-b"], (), False, id="a-victims-node-would-have-room"),
    pytest.param(7, ["long-a"], (), True, id="a-victims-node-still-short"),
    pytest.param(16, ["long-b"], (), True, id="no-switch-has-two-whole-nodes"),
    pytest.param(16, ["long-b", "long-c"], (), False, id="two-whole-nodes-under-one-switch"),
    pytest.param(10, [], (), True, id="more-than-all-free-gpus"),
    # GPUs placed this cycle count as room: the walk in full may reach the gang first.
    pytest.param(3, [], (3,), False, id="gpus-placed-this-cycle-count-as-room"),
])
@pytest.mark.parametrize("index_from", [1, INDEX_FROM], ids=["indexed", "scanned"])
def test_a_gang_is_blocked_only_where_no_displacing_fit_exists(
        gpus: int, victims: list[str], new: tuple[int, ...], blocked: bool,
        index_from: int) -> None:
    fit = in_place(cluster(4, 8, 2), RUNNING, new=new, index_from=index_from)
    assert fit.blocked_displacing(gpus, victims) is blocked


def test_a_victim_as_wide_as_the_gang_is_never_proven_kept() -> None:
    """A walk in full skips every gang at least as wide as one that failed, running or not:
    a victim spread over two nodes (placed under another scheme) would lose its GPUs."""
    running = {"spread": (("n0", (0, 1, 2)), ("n1", (0, 1, 2))),
               "other-0": on("n0", 3, 4, 5, 6, 7), "other-1": on("n1", 3, 4, 5, 6, 7)}
    fit = in_place(cluster(2, 8, 1), running)
    assert fit.blocked_displacing(5, []) is True
    assert fit.blocked_displacing(5, ["spread"]) is False


def test_gpus_chosen_by_count_are_never_proven_blocked_beside_free_ones() -> None:
    fit = in_place(cluster(4, 8, 2), RUNNING, scheme="count")
    assert fit.blocked_displacing(6, []) is False  # 8 GPUs free, spread across nodes
    assert fit.blocked_displacing(9, []) is True  # more than every free GPU


def full_walk_blocks(cl: ClusterSpec, scheme: str, running: Mapping[str, GpuSlots],
                     ahead: list[str], gpus: int, victims: list[str]) -> tuple[bool, bool]:
    """A walk opened in full: running jobs `ahead` re-placed, then the gang of `gpus`;
    whether it found no room, and whether every victim then kept its GPUs."""
    fit = CyclePlacement(cl, scheme, running)  # type: ignore[arg-type]
    for jid in ahead:
        assert fit.try_place(jid, len(gpus_of(running[jid]))) == running[jid]
    blocked = fit.try_place("gang", gpus) is None  # before the new gangs: the most room
    kept = all(len(gpus_of(running[jid])) < gpus
               and fit.try_place(jid, len(gpus_of(running[jid]))) == running[jid]
               for jid in victims)
    return blocked, kept


@pytest.mark.parametrize("index_from", [1, INDEX_FROM], ids=["indexed", "scanned"])
@pytest.mark.parametrize("scheme", ["consolidated", "count"])
def test_a_gang_proven_blocked_is_blocked_by_the_full_walk_and_its_victims_kept(
        scheme: str, index_from: int) -> None:
    proven = 0
    for seed in range(400):
        rng = random.Random(seed)
        cl = random_cluster(rng)
        running = random_previous(rng, cl, scheme)
        order = list(running)
        rng.shuffle(order)
        cut = rng.randint(0, len(order))
        ahead, victims = order[:cut], order[cut:]
        fit = in_place(cl, running, scheme, index_from=index_from)
        for k in range(rng.randint(0, 4)):
            fit.try_place(f"new{k}", rng.randint(1, max(1, fit.free_gpus)))
        gpus = rng.randint(1, cl.total_gpus)
        if not fit.blocked_displacing(gpus, victims):
            continue
        proven += 1
        blocked, kept = full_walk_blocks(cl, scheme, running, ahead, gpus, victims)
        assert blocked and kept, f"seed={seed} gpus={gpus} victims={victims}"
    assert proven >= 40  # the property is not vacuous
