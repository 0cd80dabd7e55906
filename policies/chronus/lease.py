"""Chronus' lease problem: which accepted jobs hold which terms (docs/policies/chronus.md).

Term 0 is the current one; a job needs a number of terms before its deadline, each with its
binned GPUs. The terms after a horizon are merged into segments between deadlines; a
`Selection` says which jobs are kept and when they run, and `consistent` / `fits` check it
against the merged and the exact (per-term) problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policies.mechanisms.lp import IntArray

MAX_VALUE = 10.0  # Chronus' MAX_EXPECT_VALUE: the value of meeting a deadline


@dataclass(frozen=True, slots=True)
class LeaseProblem:
    """One term's job selection. Term 0 is the current one; job i may run in terms
    [0, deadline[i]) and needs `required[i]` of them, with `gpus[i]` (binned) GPUs each."""

    gpus: tuple[int, ...]
    required: tuple[int, ...]
    deadline: tuple[int, ...]
    capacity: int
    spare_now: bool = False  # objective: leave GPUs free now (True) or use them (False)
    value: tuple[float, ...] | None = None  # per job; default MAX_VALUE

    @property
    def n(self) -> int:
        return len(self.gpus)

    def values(self) -> tuple[float, ...]:
        return self.value if self.value is not None else (MAX_VALUE,) * self.n


@dataclass(frozen=True, slots=True)
class Selection:
    """Which jobs the plan keeps and when they run.

    `exact[i]` lists job i's terms before the horizon (all its terms for the greedy);
    `tail[i][k]` is how many terms it gets in segment `segments[k]` (a [start, end) range),
    which `layout` places term by term. Every selection `LeaseSolver.select` returns has a
    layout within capacity; one built otherwise need not (`check_selection`).
    """

    chosen: tuple[bool, ...]
    exact: tuple[tuple[int, ...], ...]
    tail: tuple[tuple[int, ...], ...]
    segments: tuple[tuple[int, int], ...]
    method: str  # "milp", "milp-node-limit", "greedy", "empty"

    @property
    def run_now(self) -> tuple[bool, ...]:
        return tuple(bool(e) and e[0] == 0 for e in self.exact)


def segments(deadlines: Sequence[int], horizon: int,
             cuts: Iterable[int] = ()) -> tuple[tuple[int, int], ...]:
    """The terms after the horizon, cut at every deadline beyond it and at the extra `cuts`
    (refinements) that fall between the horizon and the last deadline."""
    last = max(deadlines, default=0)
    points = sorted({d for d in deadlines if d > horizon}
                    | {c for c in cuts if horizon < c < last})
    out = []
    start = horizon
    for end in points:
        out.append((start, end))
        start = end
    return tuple(out)


def consistent(p: LeaseProblem, sel: Selection) -> bool:
    """Whether a selection keeps the MILP's constraints: its exact terms per term, its merged
    terms in aggregate per segment. A relaxation: see `layout` for the per-term check."""
    used: dict[int, int] = {}
    seg_used = [0] * len(sel.segments)
    for i in range(p.n):
        terms = sel.exact[i]
        counts = sel.tail[i] if sel.tail else ()
        got = len(terms) + sum(counts)
        if got != (p.required[i] if sel.chosen[i] else 0) or len(set(terms)) != len(terms):
            return False
        if any(b < 0 or b >= p.deadline[i] for b in terms):
            return False
        for b in terms:
            used[b] = used.get(b, 0) + p.gpus[i]
        for j, c in enumerate(counts):
            a, e = sel.segments[j]
            if c < 0 or c > e - a or (c and p.deadline[i] < e):
                return False
            seg_used[j] += c * p.gpus[i]
    if any(u > p.capacity for u in used.values()):
        return False
    return all(u <= p.capacity * (e - a) for u, (a, e) in zip(seg_used, sel.segments,
                                                              strict=True))


def fits(p: LeaseProblem, chosen: Sequence[bool], terms: Sequence[IntArray]) -> bool:
    """The exact problem's constraints on a per-term layout: a chosen job holds exactly its
    required number of distinct terms, all before its deadline, another none; no term holds
    more GPUs than the cluster has."""
    used: dict[int, int] = {}
    for i, t in enumerate(terms):
        picked = {int(b) for b in t}
        if len(picked) != len(t) or len(t) != (p.required[i] if chosen[i] else 0):
            return False
        if any(b < 0 or b >= p.deadline[i] for b in picked):
            return False
        for b in picked:
            used[b] = used.get(b, 0) + p.gpus[i]
    return all(u <= p.capacity for u in used.values())
