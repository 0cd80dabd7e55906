"""Grouping jobs for interleaving by repeated maximum-weight matching (Muri, §1a steps 3–4).

Nodes are groups ("packings") of jobs with the same GPU count, initially one job each. An edge
joins two groups whose union has at most `MAX_GROUP` jobs, weighted by the fraction of resource
slots the union keeps busy. Each round runs a maximum-weight matching per GPU count and merges
matched pairs, in a fixed order, only while the GPU demand of all candidates exceeds the
cluster; rounds repeat (pairs → groups of 3–4) until demand fits or `MAX_GROUP` rounds passed.

Two things make this fast: every pair's weight is computed at once with numpy
(`interleave.batch_used_ratio`, bit-identical to the scalar model), and each group keeps only
its `TOP_K` best edges before rustworkx's blossom matching (Rust). The sparse graph's optimum
equals the dense one's (tests cross-check against networkx); docs/validation.md has the times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import rustworkx as rx

from domain.interleave import MAX_GROUP, Stages, batch_used_ratio, used_ratio

Group = tuple[str, ...]  # job ids
TOP_K = 32  # edges kept per group
SCALE = 1_000_000_000  # float weights → integers, so the matcher is exact and deterministic


# Weights by the (sorted) stage times of a would-be group: candidates change little between
# cycles, so most weights are found here. Bounded: cleared when it grows past the limit.
_WEIGHTS: dict[tuple[Stages, ...], float] = {}
_WEIGHTS_LIMIT = 2_000_000
BATCH_FROM = 64  # misses below this are computed one by one (numpy's per-call cost dominates)


VECTOR_FROM = 128  # groups: from here on every pair is computed at once, uncached


def pair_weights(groups: Sequence[Group], stages: Mapping[str, Stages]) -> np.ndarray:
    """Dense symmetric matrix of merge weights; 0 where a merge is not allowed or useless.

    A group with a job that has no stage times never merges (its weights stay 0).
    """
    if len(groups) >= VECTOR_FROM:
        return _all_pairs(groups, stages)
    return np.array(_cached_weights(groups, stages))


def _cached_weights(groups: Sequence[Group], stages: Mapping[str, Stages]) -> list[list[float]]:
    """`pair_weights` as nested lists, through the weight cache (for small candidate sets)."""
    n = len(groups)
    weights = [[0.0] * n for _ in range(n)]
    members = [tuple(sorted(stages[j] for j in g)) if all(j in stages for j in g) else None
               for g in groups]
    keys: dict[tuple[Stages, ...], list[tuple[int, int]]] = {}
    cached = _WEIGHTS.get
    for i in range(n):
        mi = members[i]
        if mi is None:
            continue
        row = weights[i]
        single = len(mi) == 1
        for j in range(i + 1, n):
            mj = members[j]
            if mj is None or len(mi) + len(mj) > MAX_GROUP:
                continue
            key: tuple[Stages, ...]
            if single and len(mj) == 1:  # the common case: two jobs, no sort needed
                a, b = mi[0], mj[0]
                key = (a, b) if a <= b else (b, a)
            else:
                key = tuple(sorted(mi + mj))
            w = cached(key)
            if w is None:
                keys.setdefault(key, []).append((i, j))
            else:
                row[j] = weights[j][i] = w
    if keys:
        if len(_WEIGHTS) + len(keys) > _WEIGHTS_LIMIT:
            _WEIGHTS.clear()
        for key, w in zip(keys, _compute(list(keys)), strict=True):
            _WEIGHTS[key] = w
            for i, j in keys[key]:
                weights[i][j] = weights[j][i] = w
    return weights


def _all_pairs(groups: Sequence[Group], stages: Mapping[str, Stages]) -> np.ndarray:
    """Every pair at once with numpy (large candidate sets)."""
    n = len(groups)
    weights = np.zeros((n, n))
    sizes = np.array([len(g) if all(j in stages for j in g) else MAX_GROUP + 1
                      for g in groups])
    members = np.zeros((n, MAX_GROUP, 3))  # members[i, m]: stage times of group i's m-th job
    for i, group in enumerate(groups):
        if sizes[i] <= MAX_GROUP:
            members[i, : len(group)] = [stages[j] for j in group]
    rows, cols = np.triu_indices(n, 1)
    for a in range(1, MAX_GROUP):
        for b in range(1, MAX_GROUP - a + 1):
            pick = (sizes[rows] == a) & (sizes[cols] == b)
            if pick.any():
                ii, jj = rows[pick], cols[pick]
                union = np.concatenate([members[ii, :a], members[jj, :b]], axis=1)
                # Jobs in sorted order, as the cached path keys them, so sums round alike.
                order = np.lexsort((union[:, :, 2], union[:, :, 1], union[:, :, 0]), axis=-1)
                union = np.take_along_axis(union, order[:, :, None], axis=1)
                weights[ii, jj] = weights[jj, ii] = batch_used_ratio(union)
    return weights


def _compute(unions: list[tuple[Stages, ...]]) -> list[float]:
    if len(unions) < BATCH_FROM:
        return [used_ratio(u) for u in unions]
    out = [0.0] * len(unions)
    for size in range(2, MAX_GROUP + 1):
        idx = [k for k, u in enumerate(unions) if len(u) == size]
        if idx:
            ratios = batch_used_ratio(np.array([unions[k] for k in idx]))
            for k, w in zip(idx, ratios.tolist(), strict=True):
                out[k] = w
    return out


# Matchings by the candidates' stage times, in order: between consecutive cycles most GPU
# counts see the same candidates, and then the matching is the same too.
_MATCHINGS: dict[tuple[object, ...], list[tuple[int, int]]] = {}
_MATCHINGS_LIMIT = 4096


def max_weight_pairs(groups: Sequence[Group], stages: Mapping[str, Stages],
                     top_k: int = TOP_K) -> list[tuple[int, int]]:
    """Maximum-weight matching over `groups` (index pairs i < j), on each group's best edges."""
    n = len(groups)
    if n < 2:
        return []
    key = (top_k, *(tuple(stages.get(j) for j in g) for g in groups))
    hit = _MATCHINGS.get(key)
    if hit is not None:
        return list(hit)
    pairs = _match(groups, stages, top_k)
    if len(_MATCHINGS) >= _MATCHINGS_LIMIT:
        _MATCHINGS.clear()
    _MATCHINGS[key] = pairs
    return list(pairs)


def _match(groups: Sequence[Group], stages: Mapping[str, Stages], top_k: int
           ) -> list[tuple[int, int]]:
    n = len(groups)
    if n <= top_k + 1 and n < VECTOR_FROM:  # every edge kept: no numpy round trip needed
        rows = _cached_weights(groups, stages)
        edges = [(i, j, w) for i in range(n) for j in range(i + 1, n)
                 if (w := round(rows[i][j] * SCALE)) > 0]
        return _blossom(n, edges)
    weights = pair_weights(groups, stages)
    keep = np.zeros((n, n), dtype=bool)
    if n - 1 > top_k:
        best = np.argpartition(-weights, top_k, axis=1)[:, :top_k]
        keep[np.repeat(np.arange(n), top_k), best.ravel()] = True
        keep |= keep.T
    else:
        keep[:] = True
    rows_i, cols_i = np.nonzero(np.triu(keep & (weights > 0), 1))
    scaled = np.rint(weights[rows_i, cols_i] * SCALE).astype(np.int64)
    return _blossom(n, [e for e in zip(rows_i.tolist(), cols_i.tolist(), scaled.tolist(),
                                       strict=True) if e[2] > 0])


def _blossom(n: int, edges: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    if not edges:
        return []
    graph = rx.PyGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(edges)
    pairs = rx.max_weight_matching(graph, max_cardinality=False, weight_fn=lambda w: w)
    return sorted((min(a, b), max(a, b)) for a, b in pairs)


def group_by_matching(
    candidates: Mapping[int, Sequence[str]], cluster_gpus: int, stages: Mapping[str, Stages]
) -> dict[int, list[Group]]:
    """Muri's rounds: merge matched groups while the candidates need more GPUs than exist.

    `candidates` maps a GPU count to its candidate jobs in priority order (dict order is the
    order GPU counts are visited). Returns, per GPU count, the groups in Muri's order: a merged
    pair stands where its later member stood.
    """
    groups: dict[int, list[Group]] = {g: [(job,) for job in jobs]
                                      for g, jobs in candidates.items()}
    demand = sum(g * len(jobs) for g, jobs in candidates.items())
    for _ in range(MAX_GROUP):
        if demand <= cluster_gpus:
            break
        merged: dict[int, list[Group]] = {}
        for g, nodes in groups.items():
            partner: dict[int, int] = {}
            for i, j in max_weight_pairs(nodes, stages):
                partner[i], partner[j] = j, i
            out: list[Group] = []
            for idx, node in enumerate(nodes):
                other = partner.get(idx)
                if other is None:
                    out.append(node)
                elif other < idx:  # the pair stands at its later member's place
                    if demand > cluster_gpus:
                        out.append(nodes[other] + node)
                        demand -= g
                    else:
                        out += [nodes[other], node]
            merged[g] = out
        groups = merged
    return groups
