"""Gavel's finish-time fairness (Themis' metric), heterogeneity-aware and agnostic.

    minimise  max_m rho_m, where
    rho_m = (age_m + rem_m / Σ_j T[m,j] X[m,j]) / (iso_m + rem_m / T_iso[m])
    s.t.      Gavel's base constraints (X ≥ 0, rows ≤ 1, Σ_m sf_m X[m,j] ≤ N_j)

T_iso[m] is the job's throughput under the isolated split (1/M of every type's GPUs, as time
shares of its own GPU count, rows capped at 1); iso_m accumulates, allocation after allocation,
the iterations made since the previous allocation divided by the T_iso the job had then.
`finish-time-fairness` gives every type the v100 throughput (Gavel PR #139).

DPP form: with iso_total_m = iso_m + rem_m / T_iso[m], rho_m = a_m + 1 / Σ_j C[m,j] X[m,j]
where a_m = age_m / iso_total_m and C = T · iso_total_m / rem_m, so every number is a
Parameter. Padding rows have a = 0, huge C and no GPUs: rho ≈ 0, never the maximum.
If no solver succeeds, the isolated split (as Gavel falls back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import CompiledCache, FloatArray, as_summary, bucket, solve_first
from policies.mechanisms.rounds import RoundPolicy

if TYPE_CHECKING:
    import cvxpy as cp

BUCKET_BITS = 1  # power-of-two sizes: compiling costs more than solving padded rows
SOLVERS = ("CLARABEL", "SCS")
_PAD_COEFF = 1e6


@dataclass(frozen=True, slots=True)
class _FtfLp:
    problem: cp.Problem
    x: cp.Variable
    a: cp.Parameter  # (m,)
    coeff: cp.Parameter  # (m, n)
    sf: cp.Parameter  # (m, n)
    capacity: cp.Parameter  # (n,)


def _build(shape: tuple[int, ...]) -> _FtfLp:
    import cvxpy as cp
    from cvxpy.atoms.affine.binary_operators import multiply
    from cvxpy.atoms.affine.sum import sum as cp_sum
    from cvxpy.atoms.affine.vstack import vstack
    from cvxpy.constraints.second_order import SOC

    m, n = shape
    x = cp.Variable((m, n))
    a = cp.Parameter(m, nonneg=True)
    coeff = cp.Parameter((m, n), nonneg=True)
    sf = cp.Parameter((m, n), nonneg=True)
    capacity = cp.Parameter(n, nonneg=True)
    t = cp.Variable()
    # rho_m ≤ t  ⇔  (t − a_m) · s_m ≥ 1 with s_m = Σ_j C[m,j] X[m,j]: a rotated second-order
    # cone, ‖(2, u − s)‖ ≤ u + s with u = t − a. Written as a cone, not as a + inv_pos(s),
    # because cvxpy compiles the cone form several times faster at 2,048 jobs.
    s = cp_sum(multiply(coeff, x), axis=1)
    u = t - a
    constraints = [x >= 0, cp_sum(x, axis=1) <= 1,
                   cp_sum(multiply(sf, x), axis=0) <= capacity,
                   SOC(u + s, vstack([np.full(m, 2.0), u - s]))]
    return _FtfLp(cp.Problem(cp.Minimize(t), constraints), x, a, coeff, sf, capacity)


@dataclass(slots=True)
class _History:
    iso_s: float = 0.0
    remaining: float | None = None
    t_iso: float = 0.0


@dataclass
class FinishTimeFairnessSolver:
    solvers: tuple[str, ...] = SOLVERS
    cache: CompiledCache[_FtfLp] = field(default_factory=lambda: CompiledCache(_build))
    history: dict[str, _History] = field(default_factory=dict)
    rho: dict[str, float] = field(default_factory=dict)  # at the last solution

    def solve(self, inp: AllocationInput, throughputs: FloatArray) -> FloatArray:
        t0 = time.perf_counter()
        try:
            return self._solve(inp, throughputs)
        finally:
            self.cache.stats.timed(t0)

    def _solve(self, inp: AllocationInput, throughputs: FloatArray) -> FloatArray:
        m, n = inp.shape
        isolated = inp.isolated_split()
        t_iso = (throughputs * isolated).sum(axis=1)
        iso_total = np.empty(m)
        live = set(inp.job_ids)
        for gone in [j for j in self.history if j not in live]:
            del self.history[gone]
        for i, jid in enumerate(inp.job_ids):
            h = self.history.setdefault(jid, _History())
            if h.remaining is not None and h.t_iso > 0:
                # max: a progress report that lowers the count must not make time negative
                h.iso_s += max(h.remaining - inp.remaining[i], 0.0) / h.t_iso
            h.remaining, h.t_iso = float(inp.remaining[i]), float(t_iso[i])
            iso_total[i] = h.iso_s + inp.remaining[i] / t_iso[i] if t_iso[i] > 0 else np.inf
        usable = np.all(np.isfinite(iso_total)) and np.all(inp.remaining > 0)
        if not usable:
            self.cache.stats.fallbacks += 1
            return isolated
        a = inp.age_s / iso_total
        coeff = throughputs * (iso_total / inp.remaining)[:, None]
        size = bucket(m, BUCKET_BITS)
        lp = self.cache.get((size, n))
        pad = size - m
        lp.a.value = np.concatenate([a, np.zeros(pad)])
        lp.coeff.value = np.vstack([coeff, np.full((pad, n), _PAD_COEFF)])
        lp.sf.value = np.vstack([np.repeat(inp.gpus[:, None], n, axis=1), np.zeros((pad, n))])
        lp.capacity.value = inp.capacity
        x, _ = solve_first(lp.problem, lp.x, self.solvers, rows=size,
                           stats=self.cache.stats)
        if x is None:
            self.cache.stats.fallbacks += 1
            return isolated
        x = np.clip(x[:m], 0.0, 1.0)
        with np.errstate(divide="ignore"):
            rho = a + 1.0 / (coeff * x).sum(axis=1)
        self.rho = dict(zip(inp.job_ids, map(float, rho), strict=True))
        return x


class FinishTimeFairnessPerf(RoundPolicy):
    name = "finish-time-fairness-perf"
    description = "Gavel heterogeneity-aware finish-time fairness (Themis' rho) on per-type rates"
    aware = True

    def __init__(self) -> None:
        super().__init__()
        self.lp = FinishTimeFairnessSolver()

    def solver_stats(self) -> dict[str, float | int]:
        return as_summary(self.lp.cache.stats)

    def allocate(self, inp: AllocationInput) -> FloatArray:
        return self.lp.solve(inp, inp.throughputs)


class FinishTimeFairness(FinishTimeFairnessPerf):
    name = "finish-time-fairness"
    description = "Gavel finish-time fairness, heterogeneity-agnostic: v100 rates on every type"
    aware = False

    def allocate(self, inp: AllocationInput) -> FloatArray:
        return self.lp.solve(inp, inp.reference_column("v100"))
