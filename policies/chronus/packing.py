"""Chronus' packing: a selection laid out term by term, and admission's greedy packing.

The MILP packs merged terms only in aggregate, so every selection is laid out per term before
it is trusted (`layout`); admission packs arrivals into what that layout leaves free
(`packable`, and `earliest_limit`'s binary search). See docs/policies/chronus.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.chronus.lease import LeaseProblem, Selection, consistent, fits
from policies.mechanisms.lp import IntArray


def lay_out_segment(gpus: Sequence[int], counts: Sequence[int], length: int,
                    capacity: int) -> list[IntArray] | None:
    """Job i's `counts[i]` distinct terms in a segment of `length` terms (numbered from 0),
    no term over `capacity`; None where this finds no layout (a heuristic: one may exist).
    Largest jobs first, each on the terms with the most GPUs left (the latest among equals):
    where those have no room for a job, no other terms have, given the jobs placed before."""
    free = np.full(length, capacity, dtype=np.int64)
    terms = np.arange(length)
    out = [np.empty(0, dtype=np.int64) for _ in gpus]
    for i in sorted((i for i, c in enumerate(counts) if c > 0), key=lambda i: (-gpus[i], i)):
        c = counts[i]
        if c > length:
            return None
        # one distinct key per term, highest for the most GPUs left, then the latest term
        key = free * length + terms
        pick = np.argpartition(-key, c - 1)[:c] if c < length else terms
        if free[pick].min() < gpus[i]:
            return None
        free[pick] -= gpus[i]
        out[i] = np.sort(pick)
    return out


def _tail_counts(sel: Selection, j: int) -> list[int]:
    return [t[j] for t in sel.tail] if sel.tail else [0] * len(sel.chosen)


def unlaid_segments(p: LeaseProblem, sel: Selection) -> list[int]:
    """The segments of a `consistent` selection that `lay_out_segment` cannot lay out."""
    out = []
    for j, (a, b) in enumerate(sel.segments):
        counts = _tail_counts(sel, j)
        if sum(g for g, c in zip(p.gpus, counts, strict=True) if c) <= p.capacity:
            continue  # its jobs all fit in one term: any terms will do
        if lay_out_segment(p.gpus, counts, b - a, p.capacity) is None:
            out.append(j)
    return out


def layout(p: LeaseProblem, sel: Selection) -> list[IntArray] | None:
    """Every job's terms, its exact ones and each segment's laid out per term
    (`lay_out_segment`); None where the selection is not `consistent` or a segment does not
    lay out (the MILP packs merged terms only in aggregate, which can promise too much: in
    a 2-term segment of a 4-GPU cluster, a 4-GPU job for one term and a 2-GPU job for both
    fit in aggregate, 8 ≤ 2 × 4, but not term by term)."""
    if not consistent(p, sel):
        return None
    out = [np.asarray(sel.exact[i], dtype=np.int64) for i in range(p.n)]
    for j, (a, b) in enumerate(sel.segments):
        placed = lay_out_segment(p.gpus, _tail_counts(sel, j), b - a, p.capacity)
        if placed is None:
            return None
        out = [np.concatenate([o, t + a]) for o, t in zip(out, placed, strict=True)]
    return out


def unpack(p: LeaseProblem, sel: Selection) -> list[IntArray]:
    """`layout` of a selection that has one (every selection `LeaseSolver.select` returns)."""
    terms = layout(p, sel)
    if terms is None:
        raise ValueError("the selection has no per-term layout within capacity")
    return terms


def check_selection(p: LeaseProblem, sel: Selection) -> bool:
    """Whether a selection keeps every constraint of the exact problem: it has a per-term
    layout (`layout`) that `fits`."""
    terms = layout(p, sel)
    return terms is not None and fits(p, sel.chosen, terms)


# -- admission -------------------------------------------------------------------------------

Item = tuple[int, int, int]  # (binned GPUs, terms needed, terms before the deadline)


def packable(free: IntArray, items: Sequence[Item], capacity: int) -> bool:
    """The artifact's `batch_fast_check_if_packable`: larger jobs first, then least slack,
    then latest deadline; each takes its latest terms with enough GPUs left. `free[b]` is
    what term b has left; terms after the end of `free` are idle (`capacity` free)."""
    room = _extend(free, max((e[2] for e in items), default=0), capacity).copy()
    for g, need, limit in sorted(items, key=lambda e: (-e[0], e[2] - e[1], -e[2])):
        if need <= 0:
            continue
        if need > limit:
            return False
        fits = np.flatnonzero(room[:limit] >= g)
        if len(fits) < need:
            return False
        room[fits[::-1][:need]] -= g
    return True


def earliest_limit(free: IntArray, batch: Sequence[Item], job: Item, capacity: int) -> int:
    """The artifact's binary search: the fewest terms within which `job` packs beside `batch`,
    searched from its own limit up to the furthest planned term + its need + 1 (where it
    always packs, if it fits the cluster at all)."""
    g, need, limit = job
    left = max(limit, need)
    furthest = max([len(free), left, *(b[2] for b in batch)])
    right = furthest + need + 1
    while left < right:
        mid = (left + right) // 2
        if packable(free, [*batch, (g, need, mid)], capacity):
            right = mid
        else:
            left = mid + 1
    return right


def _extend(free: IntArray, length: int, capacity: int) -> IntArray:
    """`free` with idle terms (the whole cluster) appended up to `length`."""
    if len(free) >= length:
        return free
    return np.concatenate([free, np.full(length - len(free), capacity, dtype=np.int64)])
