"""Chronus' lease MILP: HiGHS through cvxpy, compiled once per padded shape, with the
artifact's greedy as the fallback (the formulation: docs/policies/chronus.md).

Every number is a Parameter (DPP), so a term re-solves without recompiling; each solve starts
cold and is bounded by a node limit, so an answer depends only on its problem. A MILP answer
whose merged segments do not lay out per term is refined (segments cut) and solved again.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from policies.chronus.lease import LeaseProblem, Selection, consistent, segments
from policies.chronus.packing import unlaid_segments
from policies.mechanisms.lp import CompiledCache

if TYPE_CHECKING:  # cvxpy costs about a second to import: only on first use
    import cvxpy as cp


@dataclass(frozen=True, slots=True)
class MilpData:
    """Parameter values for a compiled problem of shape (jobs, horizon, segments)."""

    mask: np.ndarray[Any, np.dtype[np.float64]]  # (n, h) 1 where job i may run in term b
    seg_cap: np.ndarray[Any, np.dtype[np.float64]]  # (n, k) terms job i may take in segment k
    gpus: np.ndarray[Any, np.dtype[np.float64]]
    required: np.ndarray[Any, np.dtype[np.float64]]
    value: np.ndarray[Any, np.dtype[np.float64]]
    tie: np.ndarray[Any, np.dtype[np.float64]]  # objective weight of X[i, 0]
    cap_exact: np.ndarray[Any, np.dtype[np.float64]]  # (h,)
    cap_seg: np.ndarray[Any, np.dtype[np.float64]]  # (k,)
    segments: tuple[tuple[int, int], ...]


def milp_data(p: LeaseProblem, shape: tuple[int, int, int],
              cuts: Iterable[int] = ()) -> MilpData:
    """The MILP's numbers for `p` with its segments cut also at `cuts`, padded to `shape`
    (padding rows need 0 terms, value 0; padding segments hold 0 terms)."""
    n, h, k = shape
    segs = segments(p.deadline, h, cuts)
    if p.n > n or len(segs) > k:
        raise ValueError(f"problem ({p.n} jobs, {len(segs)} segments) exceeds shape {shape}")
    mask = np.zeros((n, h))
    seg_cap = np.zeros((n, k))
    for i, d in enumerate(p.deadline):
        mask[i, :max(0, min(d, h))] = 1.0
        for j, (a, b) in enumerate(segs):
            if d >= b:
                seg_cap[i, j] = b - a
    gpus = np.zeros(n)
    gpus[:p.n] = p.gpus
    required = np.zeros(n)
    required[:p.n] = p.required
    value = np.zeros(n)
    value[:p.n] = p.values()
    tie = (-1.0 if p.spare_now else 1.0) * gpus / max(p.capacity, 1)
    cap_seg = np.zeros(k)
    for j, (a, b) in enumerate(segs):
        cap_seg[j] = p.capacity * (b - a)
    return MilpData(mask, seg_cap, gpus, required, value, tie,
                    np.full(h, float(p.capacity)), cap_seg, segs)


@dataclass(frozen=True, slots=True)
class _Milp:
    problem: cp.Problem
    x: cp.Variable
    y: cp.Variable
    s: cp.Variable
    params: dict[str, cp.Parameter]


def build_milp(shape: tuple[int, ...]) -> _Milp:
    """The lease MILP for (jobs, horizon, segments), every number a Parameter (DPP)."""
    import cvxpy as cp
    from cvxpy.atoms.affine.binary_operators import multiply
    from cvxpy.atoms.affine.sum import sum as cp_sum

    n, h, k = shape
    x = cp.Variable((n, h), boolean=True)
    y = cp.Variable((n, k), integer=True)
    s = cp.Variable(n, boolean=True)
    par = {
        "mask": cp.Parameter((n, h), nonneg=True),
        "seg_cap": cp.Parameter((n, k), nonneg=True),
        "gpus": cp.Parameter(n, nonneg=True),
        "required": cp.Parameter(n, nonneg=True),
        "value": cp.Parameter(n, nonneg=True),
        "tie": cp.Parameter(n),
        "cap_exact": cp.Parameter(h, nonneg=True),
        "cap_seg": cp.Parameter(k, nonneg=True),
    }
    constraints = [
        x <= par["mask"], y >= 0, y <= par["seg_cap"],
        par["gpus"] @ x <= par["cap_exact"], par["gpus"] @ y <= par["cap_seg"],
        cp_sum(x, axis=1) + cp_sum(y, axis=1) == multiply(par["required"], s),
    ]
    objective = cp.Maximize(par["value"] @ s + par["tie"] @ x[:, 0])
    return _Milp(cp.Problem(objective, constraints), x, y, s, par)


def shape_for(p: LeaseProblem, horizon: int, cuts: Iterable[int] = ()) -> tuple[int, int, int]:
    """Compiled size: jobs rounded up to a power of two (at least 4); segments as many, or,
    where refinements cut more segments than that, their own power of two."""
    n = _pow2(p.n)
    return (n, horizon, max(n, _pow2(len(segments(p.deadline, horizon, cuts)))))


def _pow2(count: int) -> int:
    return max(4, 1 << (max(count, 1) - 1).bit_length())


def greedy_selection(p: LeaseProblem) -> Selection:
    """The artifact's fallback (`batch_fast_job_selection`): jobs by value, larger first, least
    slack first, latest deadline first; each takes its latest terms with room, or none."""
    order = sorted(range(p.n), key=lambda i: (-p.values()[i], -p.gpus[i],
                                             p.deadline[i] - p.required[i], -p.deadline[i], i))
    free = np.full(max(p.deadline, default=0), p.capacity, dtype=np.int64)
    chosen = [False] * p.n
    exact: list[tuple[int, ...]] = [()] * p.n
    for i in order:
        if p.required[i] == 0:
            chosen[i] = True
            continue
        g = p.gpus[i]
        room = np.flatnonzero(free[:max(p.deadline[i], 0)] >= g)[::-1][:p.required[i]]
        if len(room) < p.required[i]:
            continue
        free[room] -= g
        chosen[i] = True
        exact[i] = tuple(sorted(int(b) for b in room))
    return Selection(tuple(chosen), tuple(exact), ((),) * p.n, (), "greedy")


@dataclass(slots=True)
class MilpStats:
    terms: int = 0  # selections made
    solves: int = 0  # selections solved by MILP (terms with at least one accepted job)
    node_limit: int = 0  # MILPs that stopped at the node limit with an incumbent (used)
    timeouts: int = 0  # MILPs stopped by the time limit (greedy used)
    failures: int = 0  # solver errors, no incumbent, or an invalid plan (greedy used)
    refined: int = 0  # selections whose first MILP answer did not lay out per term
    refinements: int = 0  # MILPs re-solved with the unlaid segments split
    unlaid: int = 0  # selections still not laid out after `max_refinements` (greedy used)
    dropped: int = 0  # accepted jobs the plan could not keep (demoted)
    total_s: float = 0.0
    max_s: float = 0.0
    max_jobs: int = 0


@dataclass
class LeaseSolver:
    """Solves `LeaseProblem`s with HiGHS, compiled once per shape; splits merged segments that
    do not lay out per term and solves again, up to `max_refinements` times; greedy on failure.
    Every selection it returns has a per-term layout within capacity."""

    horizon: int = 16
    time_limit_s: float = 60.0
    node_limit: int = 2000
    max_refinements: int = 16  # halves a 4,418-term segment (Fig. 8a's longest) to single terms
    cache: CompiledCache[_Milp] = field(default_factory=lambda: CompiledCache(build_milp))
    stats: MilpStats = field(default_factory=MilpStats)

    def select(self, p: LeaseProblem) -> Selection:
        self.stats.terms += 1
        if p.n == 0:
            return Selection((), (), (), (), "empty")
        t0 = time.perf_counter()
        try:
            sel = self._refined(p)
        finally:
            dt = time.perf_counter() - t0
            self.stats.solves += 1
            self.stats.total_s += dt
            self.stats.max_s = max(self.stats.max_s, dt)
            self.stats.max_jobs = max(self.stats.max_jobs, p.n)
        if sel is None:
            sel = greedy_selection(p)  # lays out by construction: every term is exact
        self.stats.dropped += sum(1 for c in sel.chosen if not c)
        return sel

    def _refined(self, p: LeaseProblem) -> Selection | None:
        """The MILP's selection once it lays out per term. Each MILP is a relaxation of the
        exact problem (merged terms are packed in aggregate), so an optimum that lays out is
        an optimum of the exact problem; where a segment does not lay out, it is cut at its
        midpoint and the MILP solved again. A one-term segment is exact, so this ends; the cap
        bounds the work (deterministically: a count, not a clock)."""
        cuts: set[int] = set()
        for attempt in range(self.max_refinements + 1):
            sel = self._milp(p, cuts)
            if sel is None:
                return None
            unlaid = [sel.segments[j] for j in unlaid_segments(p, sel)]
            if not unlaid:
                return sel
            if attempt == 0:
                self.stats.refined += 1
            if attempt < self.max_refinements:
                self.stats.refinements += 1
                cuts.update((a + b) // 2 for a, b in unlaid)
        self.stats.unlaid += 1
        return None

    def _milp(self, p: LeaseProblem, cuts: Iterable[int]) -> Selection | None:
        from cvxpy.error import SolverError

        shape = shape_for(p, self.horizon, cuts)
        m = self.cache.get(shape)
        data = milp_data(p, shape, cuts)
        for name, par in m.params.items():
            par.value = getattr(data, name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m.problem.solve(  # type: ignore[no-untyped-call]
                    solver="HIGHS", warm_start=False, time_limit=float(self.time_limit_s),
                    mip_max_nodes=int(self.node_limit))
        except (SolverError, ValueError):
            self.stats.failures += 1
            return None
        status = str(m.problem.status)
        info = m.problem.solver_stats.extra_stats if m.problem.solver_stats else None
        nodes = int(getattr(info, "mip_node_count", 0) or 0)
        method = "milp"
        if status == "user_limit":
            if nodes < self.node_limit:  # stopped by the clock: machine-dependent, not used
                self.stats.timeouts += 1
                return None
            if getattr(info, "primal_solution_status", 0) != 2:  # no feasible incumbent
                self.stats.failures += 1
                return None
            self.stats.node_limit += 1
            method = "milp-node-limit"
        elif status != "optimal":
            self.stats.failures += 1
            return None
        sel = _read(p, m, data, method)
        if sel is None or not consistent(p, sel):
            self.stats.failures += 1
            return None
        return sel


def _read(p: LeaseProblem, m: _Milp, data: MilpData, method: str) -> Selection | None:
    if m.x.value is None or m.s.value is None or m.y.value is None:
        return None
    x = np.rint(np.asarray(m.x.value)).astype(np.int64)
    y = np.rint(np.asarray(m.y.value)).astype(np.int64)
    s = np.rint(np.asarray(m.s.value)).astype(np.int64)
    k = len(data.segments)
    chosen = tuple(bool(s[i]) for i in range(p.n))
    exact = tuple(tuple(int(b) for b in np.flatnonzero(x[i])) for i in range(p.n))
    tail = tuple(tuple(int(c) for c in y[i, :k]) for i in range(p.n))
    return Selection(chosen, exact, tail, data.segments, method)
