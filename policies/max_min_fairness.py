"""Gavel's max-min fairness (least attained service), heterogeneity-aware and agnostic.

    maximise  min_m  Σ_j T[m,j] · sf_m · X[m,j] / (w_m · T_even[m])
    s.t.      X ≥ 0,  Σ_j X[m,j] ≤ 1,  Σ_m sf_m · X[m,j] ≤ N_j

T_even[m] = Σ_j T[m,j] · E[m,j] is the job's throughput under the even split E (every job
1/M of every type, scaled so rows sum to ≤ 1): each job's effective throughput is measured
against what an equal share would give it, so fast and slow jobs are treated alike.
`max-min-fairness` is the same LP with every throughput 1 (Gavel's agnostic LAS).

The LP is built once per bucketed size with the coefficient matrix, GPU counts and capacities
as Parameters (DPP). Padding rows get the largest coefficient and no GPUs, so they can always
reach the optimum and never bind. Solver: Clarabel, then HiGHS; if both fail, the even split.

Water filling (`-water-filling` variants, Gavel PR #164): the plain LP stops at the worst-off
jobs' level and leaves the others anywhere at or above it, so spare capacity may go unused or
to the wrong type. Water filling repeats the LP: jobs whose constraint is tight with a positive
dual (they cannot gain without lowering the level) are frozen at the level, and the rest are
raised further, until every job is frozen. Gavel finds the bottleneck jobs with a MILP; the
duals of the LP identify them without one (every iteration freezes at least one job, since the
duals of the level constraints sum to 1). Iterations are capped (`MAX_LEVELS`); jobs still free
then keep the last solution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import (
    CompiledCache,
    FloatArray,
    LpStats,
    as_summary,
    bucket,
    solve_first,
)
from policies.mechanisms.rounds import RoundPolicy

if TYPE_CHECKING:
    import cvxpy as cp

BUCKET_BITS = 1  # power-of-two sizes: compiling costs more than solving padded rows
SOLVERS = ("CLARABEL", "HIGHS")
MAX_LEVELS = 12  # water-filling iterations per allocation
_FROZEN = 1e6  # lifts a frozen job out of the level constraint (values are normalised to ~1)


@dataclass(frozen=True, slots=True)
class _MaxMinLp:
    problem: cp.Problem
    x: cp.Variable
    t: cp.Variable
    level: cp.Constraint  # v_m + exempt_m ≥ t, one row per job
    coeff: cp.Parameter  # (m, n) objective coefficients per row
    sf: cp.Parameter  # (m, n) GPU count repeated across types
    capacity: cp.Parameter  # (n,)
    floor: cp.Parameter  # (m,) lower bound on v_m (a frozen job's level; else 0)
    exempt: cp.Parameter  # (m,) _FROZEN for frozen jobs, else 0


@dataclass(frozen=True, slots=True)
class MaxMinSolution:
    x: FloatArray  # (m, n), clipped to [0, 1]
    level: float  # the optimum t
    duals: FloatArray  # (m,) of the level constraints


def _build(shape: tuple[int, ...]) -> _MaxMinLp:
    import cvxpy as cp
    from cvxpy.atoms.affine.binary_operators import multiply
    from cvxpy.atoms.affine.sum import sum as cp_sum

    m, n = shape
    x = cp.Variable((m, n))
    t = cp.Variable()
    coeff = cp.Parameter((m, n), nonneg=True)
    sf = cp.Parameter((m, n), nonneg=True)
    capacity = cp.Parameter(n, nonneg=True)
    floor = cp.Parameter(m, nonneg=True)
    exempt = cp.Parameter(m, nonneg=True)
    value = cp_sum(multiply(coeff, x), axis=1)
    level = value + exempt >= t
    constraints = [
        x >= 0,
        cp_sum(x, axis=1) <= 1,
        cp_sum(multiply(sf, x), axis=0) <= capacity,
        level,
        value >= floor,
    ]
    return _MaxMinLp(cp.Problem(cp.Maximize(t), constraints), x, t, level, coeff, sf, capacity,
                     floor, exempt)


class MaxMinLp:
    """max t s.t. Σ_j coeff[m,j] X[m,j] ≥ t ∀m, and Gavel's base constraints; cached by size.

    Shared by every "raise the worst-off job" objective (max-min fairness, min makespan).
    """

    def __init__(self, solvers: tuple[str, ...] = SOLVERS) -> None:
        self.solvers = solvers
        self.cache: CompiledCache[_MaxMinLp] = CompiledCache(_build)

    @property
    def stats(self) -> LpStats:
        return self.cache.stats

    def solve(self, coeff: FloatArray, gpus: FloatArray, capacity: FloatArray
              ) -> FloatArray | None:
        """X (clipped to [0, 1]), or None if every solver failed."""
        sol = self.solve_levels(coeff, gpus, capacity)
        return None if sol is None else sol.x

    def solve_levels(self, coeff: FloatArray, gpus: FloatArray, capacity: FloatArray,
                     frozen: FloatArray | None = None) -> MaxMinSolution | None:
        """The LP with the jobs of `frozen` (their level, NaN for free jobs) held at or above
        their level and left out of the minimum."""
        t0 = time.perf_counter()
        try:
            m, n = coeff.shape
            size = bucket(m, BUCKET_BITS)
            lp = self.cache.get((size, n))
            pad = size - m
            top = float(coeff.max()) if coeff.size else 1.0
            lp.coeff.value = np.vstack([coeff, np.full((pad, n), max(top, 1e-12))])
            lp.sf.value = np.vstack([np.repeat(gpus[:, None], n, axis=1), np.zeros((pad, n))])
            lp.capacity.value = capacity
            held = np.zeros(size, dtype=bool)
            floor = np.zeros(size)
            if frozen is not None:
                held[:m] = ~np.isnan(frozen)
                floor[:m] = np.where(held[:m], frozen, 0.0)
            lp.floor.value = floor
            lp.exempt.value = np.where(held, _FROZEN, 0.0)
            x, _ = solve_first(lp.problem, lp.x, self.solvers, rows=size, stats=self.stats)
            if x is None or lp.t.value is None:
                self.cache.stats.fallbacks += 1
                return None
            duals = lp.level.dual_value
            dual = np.zeros(m) if duals is None else np.asarray(duals, dtype=np.float64)[:m]
            return MaxMinSolution(np.clip(x[:m], 0.0, 1.0), float(lp.t.value), dual)
        finally:
            self.cache.stats.timed(t0)


def normalised(inp: AllocationInput, throughputs: FloatArray) -> FloatArray:
    """Max-min coefficients: throughput × GPUs / (weight × throughput under the even split)."""
    t_even = (throughputs * inp.even_split()).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(t_even > 0, inp.gpus / (inp.weights * t_even), 0.0)
    out: FloatArray = throughputs * scale[:, None]
    return out


def max_min_fairness(lp: MaxMinLp, inp: AllocationInput, throughputs: FloatArray
                     ) -> FloatArray:
    """Gavel's normalised max-min allocation; the even split if no solver succeeds."""
    x = lp.solve(normalised(inp, throughputs), inp.gpus, inp.capacity)
    return inp.even_split() if x is None else x


def water_filling(lp: MaxMinLp, inp: AllocationInput, throughputs: FloatArray) -> FloatArray:
    """Max-min raised level by level (see the module docstring)."""
    coeff = normalised(inp, throughputs)
    m = len(inp.job_ids)
    frozen = np.full(m, np.nan)
    best: MaxMinSolution | None = None
    for _ in range(MAX_LEVELS):
        sol = lp.solve_levels(coeff, inp.gpus, inp.capacity, frozen)
        if sol is None:
            break
        best = sol
        free = np.isnan(frozen)
        # Bottlenecks: positive dual (tight and binding); if degenerate duals name none,
        # the free jobs at the level.
        tight = free & (sol.duals > 1e-6 * max(float(sol.duals.max()), 1e-12))
        if not tight.any():
            value = (coeff * sol.x).sum(axis=1)
            tight = free & (value <= sol.level * (1 + 1e-6) + 1e-9)
        if not tight.any():
            break
        # A hair below the level, so the next LP stays feasible despite solver tolerance.
        frozen[tight] = sol.level * (1 - 1e-6)
        if not np.isnan(frozen).any():
            break
    return inp.even_split() if best is None else best.x


class MaxMinFairnessPerf(RoundPolicy):
    """The four variants differ in two flags: `aware` (per-type throughputs, else every
    throughput 1, as Gavel's agnostic LAS) and `water_fill` (see the module docstring)."""

    name = "max-min-fairness-perf"
    description = "Gavel heterogeneity-aware max-min fairness (LAS) on per-type throughputs"
    aware = True
    water_fill = False

    def __init__(self) -> None:
        super().__init__()
        self.lp = MaxMinLp()

    def solver_stats(self) -> dict[str, float | int]:
        return as_summary(self.lp.stats)

    def allocate(self, inp: AllocationInput) -> FloatArray:
        rates = inp.throughputs if self.aware else np.ones(inp.shape)
        solve = water_filling if self.water_fill else max_min_fairness
        return solve(self.lp, inp, rates)


class MaxMinFairness(MaxMinFairnessPerf):
    name = "max-min-fairness"
    description = "Gavel max-min fairness (LAS), heterogeneity-agnostic: every throughput 1"
    aware = False


class MaxMinFairnessWaterFillingPerf(MaxMinFairnessPerf):
    name = "max-min-fairness-water-filling-perf"
    description = "Gavel heterogeneity-aware max-min fairness, raised level by level"
    water_fill = True


class MaxMinFairnessWaterFilling(MaxMinFairnessPerf):
    name = "max-min-fairness-water-filling"
    description = "Gavel max-min fairness raised level by level, heterogeneity-agnostic"
    aware = False
    water_fill = True
