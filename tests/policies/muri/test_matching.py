from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest

from policies.muri.matching import (
    _WEIGHTS,
    _all_pairs,
    group_by_matching,
    max_weight_pairs,
    pair_weights,
)

A, B = (1.0, 2.0, 0.0), (2.0, 1.0, 0.0)  # complementary: good partners
D = (1.0, 0.1, 0.0)  # data-bound: a poor partner for another D


def _stages(n: int, seed: int) -> dict[str, tuple[float, ...]]:
    rng = random.Random(seed)
    return {f"j{i}": tuple(round(rng.uniform(0.001, 0.8), 3) for _ in range(3))
            for i in range(n)}


def test_weights_are_symmetric_and_only_for_groups_of_at_most_four() -> None:
    st = _stages(8, 1)
    groups = [("j0",), ("j1", "j2"), ("j3", "j4", "j5"), ("j6",), ("j7",)]
    w = pair_weights(groups, st)
    assert np.array_equal(w, w.T) and np.all(np.diag(w) == 0)
    assert w[1, 2] == 0  # 2 + 3 jobs > 4
    assert w[0, 2] > 0 and w[1, 3] > 0


def test_a_job_without_stage_times_never_merges() -> None:
    st = {"a": A, "b": B}
    w = pair_weights([("a",), ("b",), ("x",)], st)
    assert w[0, 1] > 0 and w[0, 2] == w[1, 2] == 0


def test_cached_and_vectorised_weights_agree_bit_for_bit() -> None:
    st = _stages(300, 2)
    groups = [(f"j{i}",) for i in range(60)] + [(f"j{i}", f"j{i + 1}")
                                                for i in range(100, 160, 2)]
    _WEIGHTS.clear()
    assert np.array_equal(pair_weights(groups, st), _all_pairs(groups, st))


@pytest.mark.parametrize(("seed", "n"), [(s, n) for s in range(4) for n in (30, 60)])
def test_matching_reaches_the_networkx_optimum(seed: int, n: int) -> None:
    st = _stages(n, seed)
    groups = [(j,) for j in st]
    w = pair_weights(groups, st)
    g = nx.Graph()
    for i in range(len(groups)):
        for j in range(i + 1, len(groups)):
            g.add_edge(i, j, weight=round(w[i, j] * 1e9))
    best = sum(w[min(a, b), max(a, b)] for a, b in nx.max_weight_matching(g))
    ours = max_weight_pairs(groups, st)  # each job's 32 best edges: the same optimum
    assert sum(w[i, j] for i, j in ours) == pytest.approx(best, rel=1e-12)
    assert len({x for pair in ours for x in pair}) == 2 * len(ours)  # a matching


def test_the_best_partner_is_chosen() -> None:
    st = {"a": A, "b": B, "c": D, "d": D}
    pairs = max_weight_pairs([("a",), ("b",), ("c",), ("d",)], st)
    assert (0, 1) in pairs  # a with b: they hide each other's data loading


@pytest.mark.parametrize(
    ("cluster", "sizes"),
    [
        (4, [1, 1, 1, 1]),  # demand 4 fits: nothing merges
        (3, [1, 1, 2]),  # one merge brings demand to 3, the other matched pair stays apart
        (2, [2, 2]),
        (1, [4]),  # a second round merges the pairs
    ],
)
def test_merging_stops_once_the_demand_fits(cluster: int, sizes: list[int]) -> None:
    st = {"a": A, "b": B, "c": A, "d": B}
    out = group_by_matching({1: ["a", "b", "c", "d"]}, cluster, st)
    assert sorted(len(g) for g in out[1]) == sizes
    assert sorted(j for g in out[1] for j in g) == ["a", "b", "c", "d"]
    for g in out[1]:
        if len(g) == 2:  # complementary jobs pair up: one A-like with one B-like
            assert {st[j] for j in g} == {A, B}


def test_groups_only_form_within_one_gpu_count() -> None:
    st = {"a": A, "b": B, "c": A, "d": B}
    out = group_by_matching({1: ["a", "b"], 2: ["c", "d"]}, 1, st)
    assert all(len(g) == 2 for g in out[1] + out[2])
    assert {frozenset(g) for g in out[1]} == {frozenset({"a", "b"})}
