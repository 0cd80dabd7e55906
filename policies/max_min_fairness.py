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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from policies.allocation import AllocationInput
from policies.lp import CompiledCache, FloatArray, LpStats, bucket, solve_first
from policies.rounds import RoundPolicy

if TYPE_CHECKING:
    import cvxpy as cp

BUCKET_BITS = 1  # power-of-two sizes: compiling costs more than solving padded rows
SOLVERS = ("CLARABEL", "HIGHS")


@dataclass(frozen=True, slots=True)
class _MaxMinLp:
    problem: cp.Problem
    x: cp.Variable
    coeff: cp.Parameter  # (m, n) objective coefficients per row
    sf: cp.Parameter  # (m, n) GPU count repeated across types
    capacity: cp.Parameter  # (n,)


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
    constraints = [
        x >= 0,
        cp_sum(x, axis=1) <= 1,
        cp_sum(multiply(sf, x), axis=0) <= capacity,
        cp_sum(multiply(coeff, x), axis=1) >= t,
    ]
    return _MaxMinLp(cp.Problem(cp.Maximize(t), constraints), x, coeff, sf, capacity)


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
            x, _ = solve_first(lp.problem, lp.x, self.solvers)
            if x is None:
                self.cache.stats.fallbacks += 1
                return None
            return np.clip(x[:m], 0.0, 1.0)
        finally:
            self.cache.stats.timed(t0)


def max_min_fairness(lp: MaxMinLp, inp: AllocationInput, throughputs: FloatArray
                     ) -> FloatArray:
    """Gavel's normalised max-min allocation; the even split if no solver succeeds."""
    even = inp.even_split()
    t_even = (throughputs * even).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(t_even > 0, inp.gpus / (inp.weights * t_even), 0.0)
    x = lp.solve(throughputs * scale[:, None], inp.gpus, inp.capacity)
    return even if x is None else x


class MaxMinFairnessPerf(RoundPolicy):
    name = "max-min-fairness-perf"
    description = "Gavel heterogeneity-aware max-min fairness (LAS) on per-type throughputs"
    aware = True

    def __init__(self) -> None:
        super().__init__()
        self.lp = MaxMinLp()

    def allocate(self, inp: AllocationInput) -> FloatArray:
        return max_min_fairness(self.lp, inp, inp.throughputs)


class MaxMinFairness(MaxMinFairnessPerf):
    name = "max-min-fairness"
    description = "Gavel max-min fairness (LAS), heterogeneity-agnostic: every throughput 1"
    aware = False

    def allocate(self, inp: AllocationInput) -> FloatArray:
        return max_min_fairness(self.lp, inp, np.ones(inp.shape))
