"""Gavel's cost policies: most throughput per dollar, optionally meeting SLOs.

    maximise  Σ_m Σ_j T[m,j] X[m,j] / price_j       (Gavel's throughput normalised by cost)
    s.t.      Gavel's base constraints
              Σ_j T[m,j] X[m,j] ≥ rem_m / (deadline_m − now)   for jobs with an SLO (min-cost-slo)

Prices are dollars per GPU-hour by type: a node's `gpu_price_per_hour`, else the GCP prices
Gavel's code uses (v100 0.74, p100 0.43, k80 0.135), else 1. When the SLOs cannot all be met
Gavel drops them and solves again; so does Loom (an SLO already missed asks for nothing more
than the plain objective). Solver: HiGHS, then Clarabel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import CompiledCache, FloatArray, as_summary, bucket, solve_first
from policies.mechanisms.rounds import RoundPolicy

if TYPE_CHECKING:
    import cvxpy as cp

SOLVERS = ("HIGHS", "CLARABEL")
BUCKET_BITS = 1


@dataclass(frozen=True, slots=True)
class _CostLp:
    problem: cp.Problem
    x: cp.Variable
    value: cp.Parameter  # (m, n) throughput per dollar
    rate: cp.Parameter  # (m, n) throughput, for the SLO rows
    need: cp.Parameter  # (m,) iterations/s each job must get (0: no SLO)
    sf: cp.Parameter
    capacity: cp.Parameter


def _build(shape: tuple[int, ...]) -> _CostLp:
    import cvxpy as cp
    from cvxpy.atoms.affine.binary_operators import multiply
    from cvxpy.atoms.affine.sum import sum as cp_sum

    m, n = shape
    x = cp.Variable((m, n))
    value = cp.Parameter((m, n), nonneg=True)
    rate = cp.Parameter((m, n), nonneg=True)
    need = cp.Parameter(m, nonneg=True)
    sf = cp.Parameter((m, n), nonneg=True)
    capacity = cp.Parameter(n, nonneg=True)
    constraints = [x >= 0, cp_sum(x, axis=1) <= 1,
                   cp_sum(multiply(sf, x), axis=0) <= capacity,
                   cp_sum(multiply(rate, x), axis=1) >= need]
    problem = cp.Problem(cp.Maximize(cp_sum(multiply(value, x))), constraints)
    return _CostLp(problem, x, value, rate, need, sf, capacity)


class MinCost(RoundPolicy):
    name = "min-cost"
    description = "Gavel throughput per dollar (max_sum_throughput_normalized_by_cost_perf)"
    aware = True
    slo = False

    def __init__(self) -> None:
        super().__init__()
        self.cache: CompiledCache[_CostLp] = CompiledCache(_build)
        self.slo_dropped = 0  # allocations where the SLOs could not all be met

    def solver_stats(self) -> dict[str, float | int]:
        return as_summary(self.cache.stats)

    def allocate(self, inp: AllocationInput) -> FloatArray:
        t0 = time.perf_counter()
        try:
            return self._allocate(inp)
        finally:
            self.cache.stats.timed(t0)

    def _allocate(self, inp: AllocationInput) -> FloatArray:
        m, n = inp.shape
        size = bucket(m, BUCKET_BITS)
        lp = self.cache.get((size, n))
        pad = np.zeros((size - m, n))
        # Dollars per hour to per second does not move the optimum; keep values near 1.
        lp.value.value = np.vstack([inp.throughputs / inp.prices / inp.throughputs.max(), pad])
        lp.rate.value = np.vstack([inp.throughputs, pad])
        lp.sf.value = np.vstack([np.repeat(inp.gpus[:, None], n, axis=1), pad])
        lp.capacity.value = inp.capacity
        need = np.zeros(size)
        if self.slo:
            with np.errstate(divide="ignore", invalid="ignore"):
                left = inp.deadline_s - inp.now
                need[:m] = np.where(np.isfinite(left) & (left > 0),
                                    inp.remaining / np.where(left > 0, left, 1.0), 0.0)
        lp.need.value = need
        stats = self.cache.stats
        x, _ = solve_first(lp.problem, lp.x, SOLVERS, rows=size, stats=stats)
        if x is None and need.any():
            self.slo_dropped += 1
            lp.need.value = np.zeros(size)
            x, _ = solve_first(lp.problem, lp.x, SOLVERS, rows=size, stats=stats)
        if x is None:
            self.cache.stats.fallbacks += 1
            return inp.even_split()
        return np.clip(x[:m], 0.0, 1.0)


class MinCostSlo(MinCost):
    name = "min-cost-slo"
    description = "Gavel throughput per dollar subject to each job's SLO (deadline)"
    slo = True
