"""`FreeIndex` (domain/free_gpus.py): the per-switch counts of whole nodes (which let a wide
gang pass over a switch unread) and of available GPUs (which let a spread gang find the
fullest switch without reading every node) match a recount, and its fullest nodes a sort of
every node, after any sequence of node changes."""

from __future__ import annotations

import random

import pytest

from domain.free_gpus import FreeIndex, NodeGpus


def switches_of(sizes: list[list[int]]) -> list[list[NodeGpus]]:
    pos = iter(range(10**6))
    return [[NodeGpus(f"s{s}n{k}", f"sw{s}", size, (1 << size) - 1, 0, "A", (), next(pos))
             for k, size in enumerate(group)] for s, group in enumerate(sizes)]


def recount(switches: list[list[NodeGpus]], displace: bool) -> list[int]:
    return [sum((n.free if displace else n.free & ~n.held) == (1 << n.size) - 1 for n in group)
            for group in switches]


@pytest.mark.parametrize("seed", range(40))
def test_per_switch_counts_match_a_recount(seed: int) -> None:
    rng = random.Random(seed)
    uniform = seed % 2 == 0  # whole nodes are counted where every node is of one size
    switches = switches_of([[4 if uniform else rng.choice([2, 4, 8])] * rng.randint(1, 4)
                            for _ in range(rng.randint(1, 4))])
    nodes = [n for group in switches for n in group]
    index = FreeIndex(nodes, switches)
    for _ in range(60):
        node = rng.choice(nodes)
        node.free = rng.getrandbits(node.size) if rng.random() < 0.7 else (1 << node.size) - 1
        node.held = rng.getrandbits(node.size) & node.free if rng.random() < 0.5 else 0
        index.update(node)
        for displace in (False, True):
            if uniform:
                assert index.whole(displace) == recount(switches, displace), (seed, displace)
            assert index.switch_free(displace) == [
                sum(n.available(displace) for n in group) for group in switches], seed
            assert list(index.fullest(displace)) == [  # a stable sort of every node
                n.pos for n in sorted(nodes, key=lambda n: -n.available(displace))
                if n.available(displace)], (seed, displace)


def test_nodes_of_several_sizes_are_not_counted() -> None:
    switches = switches_of([[4, 8]])
    index = FreeIndex([n for group in switches for n in group], switches)
    assert index.whole(True) is None and index.whole(False) is None
    assert index.switch_free(True) == [12]
