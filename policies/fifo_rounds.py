"""Gavel's FIFO on a heterogeneous cluster, realised by the round mechanism.

Jobs are allocated whole GPU types (X[m, j] = 1) in arrival order until the first job that no
type can hold (no job jumps the queue); unallocated jobs do not run. Two variants:

* `fifo-perf` (Gavel's FIFO_Perf): recomputed from scratch at every allocation, each job gets
  the type where it is fastest among those with enough free GPUs;
* `fifo-random` (Gavel's base FIFO): a job keeps its type until it finishes; a new job gets a
  type chosen uniformly (seeded) among those with enough free GPUs.
"""

from __future__ import annotations

import random

import numpy as np
from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import FloatArray
from policies.mechanisms.rounds import RoundPolicy
from schemas.throughputs import ThroughputTable


class FifoPerf(RoundPolicy):
    name = "fifo-perf"
    description = "Gavel FIFO, heterogeneity-aware: each job on its fastest free GPU type"
    aware = True
    skip_unallocated = True
    sticky = False  # keep each job's type across allocations

    def __init__(self) -> None:
        super().__init__()
        self._rng = random.Random(0)
        self._assigned: dict[str, str] = {}

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        super().configure(seed=seed, round_s=round_s, profile=profile, overhead=overhead,
                          job_sizes=job_sizes)
        self._rng = random.Random(seed)

    def allocate(self, inp: AllocationInput) -> FloatArray:
        live = set(inp.job_ids)
        kept = {j: t for j, t in self._assigned.items() if j in live} if self.sticky else {}
        free = dict(zip(inp.types, inp.capacity.tolist(), strict=True))
        row = {jid: i for i, jid in enumerate(inp.job_ids)}
        for jid, t in kept.items():
            free[t] -= inp.gpus[row[jid]]
        for i, jid in enumerate(inp.job_ids):
            if jid in kept:
                continue
            fits = [t for t in inp.types if free[t] >= inp.gpus[i]]
            if not fits:
                break  # FIFO: nobody overtakes the head of the queue
            t = self._choose(inp, i, fits)
            if inp.throughputs[i, inp.types.index(t)] > 0:
                kept[jid] = t
                free[t] -= inp.gpus[i]
        self._assigned = kept
        x = np.zeros(inp.shape)
        for jid, t in kept.items():
            x[row[jid], inp.types.index(t)] = 1.0
        return x

    def _choose(self, inp: AllocationInput, i: int, fits: list[str]) -> str:
        rates = [inp.throughputs[i, inp.types.index(t)] for t in fits]
        return fits[int(np.argmax(rates))]


class FifoRandom(FifoPerf):
    name = "fifo-random"
    description = "Gavel FIFO, heterogeneity-agnostic: a random free GPU type per job"
    aware = False
    sticky = True

    def _choose(self, inp: AllocationInput, i: int, fits: list[str]) -> str:
        return fits[self._rng.randrange(len(fits))]
