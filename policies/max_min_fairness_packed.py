"""Gavel's max-min fairness with space sharing (`max_min_fairness_packed`).

Variables are time shares X[c, j] of every combination c on GPU type j: each job alone, and
each profiled pair of jobs with the same GPU count sharing GPUs. A job's normalised throughput
adds what it makes alone and in every pair it belongs to (at the pair's co-located rate):

    maximise  min_m  Σ_{c ∋ m} Σ_j T_m(c, j) · sf_m · X[c, j] / (w_m · T_even[m])
    s.t.      X ≥ 0,  Σ_{c ∋ m} Σ_j X[c, j] ≤ 1 ∀m,  Σ_c sf_c · X[c, j] ≤ N_j ∀j

(a pair counts its GPUs once: its jobs share them). The sparsity pattern changes with the set
of jobs, so this LP is rebuilt at each allocation from sparse matrices rather than compiled
once with Parameters; with M jobs it has O(M²) variables, which is why Gavel calls it slow.
"""

from __future__ import annotations

import time

import numpy as np

from policies.mechanisms.allocation import AllocationInput, PairTable
from policies.mechanisms.lp import FloatArray, LpStats, as_summary, solve_first
from policies.mechanisms.rounds import RoundPolicy

SOLVERS = ("CLARABEL", "HIGHS")


class MaxMinFairnessPacked(RoundPolicy):
    name = "max-min-fairness-packed"
    description = "Gavel max-min fairness with space sharing from co-location throughputs"
    aware = True
    packing = True

    def __init__(self) -> None:
        super().__init__()
        self.stats = LpStats()

    def solver_stats(self) -> dict[str, float | int]:
        return as_summary(self.stats)

    def allocate(self, inp: AllocationInput) -> FloatArray:  # pragma: no cover - packing only
        raise NotImplementedError("max-min-fairness-packed allocates through allocate_packed")

    def allocate_packed(self, inp: AllocationInput, pairs: PairTable) -> FloatArray:
        t0 = time.perf_counter()
        try:
            x = self._solve(inp, pairs)
        finally:
            self.stats.timed(t0)
        if x is None:
            self.stats.fallbacks += 1
            out = np.zeros((len(inp.job_ids) + len(pairs.combos), len(inp.types)))
            out[: len(inp.job_ids)] = inp.even_split()
            return out
        return x

    def _solve(self, inp: AllocationInput, pairs: PairTable) -> FloatArray | None:
        import cvxpy as cp  # both heavy to import: only when this policy solves
        import scipy.sparse as sp

        m, n = inp.shape
        p = len(pairs.combos)
        rows = m + p  # combinations: singles first, then pairs
        even = inp.even_split()
        t_even = (inp.throughputs * even).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            coef = np.where(t_even > 0, inp.gpus / (inp.weights * t_even), 0.0)
        var = np.arange(rows * n).reshape(rows, n)  # index of X[c, j] in the flat variable
        # job m's normalised throughput: its single row, then each pair it belongs to
        job_idx = [np.repeat(np.arange(m), n)]
        var_idx = [var[:m].ravel()]
        vals = [(inp.throughputs * coef[:, None]).ravel()]
        share_job, share_var = [np.repeat(np.arange(m), n)], [var[:m].ravel()]
        for pos in (0, 1):
            if not p:
                break
            who = pairs.members[:, pos]
            job_idx.append(np.repeat(who, n))
            var_idx.append(var[m:].ravel())
            vals.append((pairs.throughputs[:, :, pos] * coef[who][:, None]).ravel())
            share_job.append(np.repeat(who, n))
            share_var.append(var[m:].ravel())
        gain = sp.csr_matrix((np.concatenate(vals), (np.concatenate(job_idx),
                                                     np.concatenate(var_idx))),
                             shape=(m, rows * n))
        share = sp.csr_matrix((np.ones(sum(len(v) for v in share_var)),
                               (np.concatenate(share_job), np.concatenate(share_var))),
                              shape=(m, rows * n))
        sf = np.concatenate([inp.gpus, inp.gpus[pairs.members[:, 0]] if p else np.zeros(0)])
        cap = sp.csr_matrix((np.repeat(sf, n), (np.tile(np.arange(n), rows), var.ravel())),
                            shape=(n, rows * n))
        x = cp.Variable(rows * n)
        t = cp.Variable()
        problem = cp.Problem(cp.Maximize(t), [x >= 0, share @ x <= 1, cap @ x <= inp.capacity,
                                              gain @ x >= t])
        value, _ = solve_first(problem, x, SOLVERS, stats=self.stats)
        return None if value is None else np.clip(value.reshape(rows, n), 0.0, 1.0)
