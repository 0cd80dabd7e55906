"""AlloX (Le et al., EuroSys'20) as Gavel implements it: min-cost matching of jobs to GPUs.

Single-GPU jobs only (Gavel asserts it; Loom rejects bigger jobs at admission). Each
allocation, the jobs without a GPU, oldest first (at most max(α·M, free GPUs) of them), are
matched to (free GPU w, position k) slots, where a job placed k-th from last on w delays k jobs
by its processing time: cost[i, (k, w)] = k · rem_i / T_i(type of w) + waiting time of i
(Hungarian method, scipy's `linear_sum_assignment`). Each GPU then runs the job matched last
from the end, i.e. first; jobs keep their GPU type until they finish (non-preemptive).

Ties: jobs with the same work, speeds and waiting time (a batch submitted at once) have equal
cost rows, so any permutation of their slots is optimal too, and which one scipy returns is
an accident of its implementation. `canonical_ties` hands such jobs their slots in a fixed
order (the earlier job in the waiting order runs sooner), so the matching solver's choice
among equal optima never reaches a decision. GPUs of one type are interchangeable already:
only the type a job is matched to is kept.
"""

from __future__ import annotations

import numpy as np

from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import FloatArray, IntArray
from policies.mechanisms.rounds import RoundPolicy
from schemas.job import JobSpec

_NO_RATE = 1e-10  # Gavel's stand-in for a zero throughput



def canonical_ties(cost: FloatArray, rows: IntArray, cols: IntArray, workers: int
                   ) -> IntArray:
    """`cols` (the slot k · workers + w matched to each row of `rows`) with the slots of
    interchangeable jobs, rows of `cost` that are equal, handed out in a fixed order: the
    job of the lower row gets the slot with fewer jobs ahead of it on its GPU (then the lower
    GPU, then the earlier position). Permuting equal rows keeps the total cost, so the
    matching stays optimal."""
    k, w = np.divmod(cols, workers)
    ahead = np.array([int(np.sum((w == w[i]) & (k > k[i]))) for i in range(len(cols))],
                     dtype=np.int64)
    groups: dict[bytes, list[int]] = {}
    for i, r in enumerate(rows.tolist()):
        groups.setdefault(cost[r].tobytes(), []).append(i)
    out = cols.copy()
    for members in groups.values():
        if len(members) < 2:
            continue
        slots = sorted(members, key=lambda i: (ahead[i], w[i], k[i]))
        for i, s in zip(sorted(members, key=lambda i: rows[i]), slots, strict=True):
            out[i] = cols[s]
    return out


class AlloX(RoundPolicy):
    name = "allox"
    description = "AlloX min-cost job-to-GPU matching (Gavel's baseline; single-GPU jobs)"
    aware = True
    skip_unallocated = True

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = alpha
        self._held: dict[str, str] = {}  # job → GPU type it was given

    def admit(self, spec: JobSpec) -> str | None:
        if spec.gpus != 1:
            return f"allox schedules single-GPU jobs only; this job asks for {spec.gpus}"
        return None

    def allocate(self, inp: AllocationInput) -> FloatArray:
        from scipy.optimize import linear_sum_assignment

        live = set(inp.job_ids)
        self._held = {j: t for j, t in self._held.items() if j in live}
        row = {jid: i for i, jid in enumerate(inp.job_ids)}
        free = {t: int(c) for t, c in zip(inp.types, inp.capacity, strict=True)}
        for t in self._held.values():
            free[t] -= 1
        workers = [t for t in inp.types for _ in range(max(free[t], 0))]
        waiting = sorted((j for j in inp.job_ids if j not in self._held),
                         key=lambda j: (-inp.age_s[row[j]], row[j]))
        waiting = waiting[:max(int(self.alpha * len(waiting)), len(workers))]
        if waiting and workers:
            idx = [row[j] for j in waiting]
            col = [inp.types.index(t) for t in workers]
            rates = inp.throughputs[np.ix_(idx, col)]
            base = inp.remaining[idx][:, None] / np.where(rates > 0, rates, _NO_RATE)
            m, n = base.shape
            cost = np.concatenate([(k + 1) * base for k in range(m)], axis=1)
            cost += inp.age_s[idx][:, None]
            rows, cols = linear_sum_assignment(cost)
            cols = canonical_ties(cost, rows, cols, n)
            first: dict[int, tuple[int, str]] = {}  # worker → (position from last, job)
            for r, c in zip(rows, cols, strict=True):
                k, w = divmod(int(c), n)
                if w not in first or k > first[w][0]:
                    first[w] = (k, waiting[r])
            for w, (_, jid) in first.items():
                self._held[jid] = workers[w]
        x = np.zeros(inp.shape)
        for jid, t in self._held.items():
            x[row[jid], inp.types.index(t)] = 1.0
        return x
