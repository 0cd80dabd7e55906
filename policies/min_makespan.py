"""Gavel's minimum-makespan policy (`min_total_duration_perf`), heterogeneity-aware.

Every active job must finish within T: Σ_j T[m,j] X[m,j] ≥ rem_m / T under Gavel's base
constraints, T as small as possible. Gavel bisects on T (1.05 tolerance, an LP per step);
with z = 1/T the problem is one LP, max z s.t. Σ_j (T[m,j] / rem_m) X[m,j] ≥ z, the same shape
as max-min fairness, so Loom solves it exactly in one solve with the shared `MaxMinLp`.
If no solver succeeds, the even split.
"""

from __future__ import annotations

import numpy as np

from policies.max_min_fairness import MaxMinLp
from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import FloatArray, as_summary
from policies.mechanisms.rounds import RoundPolicy


class MinMakespan(RoundPolicy):
    name = "min-makespan"
    description = "Gavel minimum makespan: every job done as early as the slowest allows"
    aware = True

    def __init__(self) -> None:
        super().__init__()
        self.lp = MaxMinLp()

    def solver_stats(self) -> dict[str, float | int]:
        return as_summary(self.lp.stats)

    def allocate(self, inp: AllocationInput) -> FloatArray:
        coeff = inp.throughputs / np.maximum(inp.remaining, 1e-9)[:, None]
        # Scale so the largest coefficient is 1: remaining iterations span decades.
        top = float(coeff.max()) if coeff.size else 1.0
        x = self.lp.solve(coeff / top if top > 0 else coeff, inp.gpus, inp.capacity)
        return inp.even_split() if x is None else x
