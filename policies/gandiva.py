"""Gandiva's packing (Xiao et al., OSDI'18) as Gavel's baseline implements it.

While the jobs fit in the cluster, every job gets an equal share of every GPU type. When they
ask for more GPUs than exist, jobs not yet paired are paired at random (seeded; only jobs with
the same GPU count), pairs whose normalised co-located throughput (Σ over types and members of
co-located / alone) falls below 1 are split again, and the cluster's time is divided equally
among the resulting combinations (each pair and each job left alone), rows capped at 1.
"""

from __future__ import annotations

import random

import numpy as np
from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from policies.mechanisms.allocation import AllocationInput, PairTable
from policies.mechanisms.lp import FloatArray
from policies.mechanisms.rounds import RoundPolicy
from schemas.throughputs import ThroughputTable


class Gandiva(RoundPolicy):
    name = "gandiva"
    description = "Gandiva's random pairing for space sharing, equal time shares (Gavel)"
    aware = True
    packing = True

    def __init__(self) -> None:
        super().__init__()
        self._rng = random.Random(0)
        self._partner: dict[str, str | None] = {}  # job → its pair partner (None: alone)

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        super().configure(seed=seed, round_s=round_s, profile=profile, overhead=overhead,
                          job_sizes=job_sizes)
        self._rng = random.Random(seed)

    def allocate(self, inp: AllocationInput) -> FloatArray:  # pragma: no cover - packing only
        raise NotImplementedError("gandiva allocates through allocate_packed")

    def allocate_packed(self, inp: AllocationInput, pairs: PairTable) -> FloatArray:
        m, n = inp.shape
        row = {jid: i for i, jid in enumerate(inp.job_ids)}
        pair_row = {c: m + k for k, c in enumerate(pairs.combos)}
        self._forget(inp, pairs, row, pair_row)
        x = np.zeros((m + len(pairs.combos), n))
        if inp.gpus.sum() <= inp.capacity.sum():
            self._partner = {}
            scheduled = list(range(m))
        else:
            self._pair_up(inp, row, pair_row)
            scheduled = []
            for jid in inp.job_ids:
                other = self._partner.get(jid)
                if other is None:
                    scheduled.append(row[jid])
                elif row[jid] < row[other]:
                    scheduled.append(pair_row[(jid, other)])
        gpus = np.concatenate([inp.gpus, inp.gpus[pairs.members[:, 0]]
                               if len(pairs.combos) else np.zeros(0)])
        share = inp.capacity / max(len(scheduled), 1)
        for r in scheduled:
            x[r] = share / gpus[r]
        out: FloatArray = x / np.maximum(x.sum(axis=1), 1.0)[:, None]
        return out

    def _forget(self, inp: AllocationInput, pairs: PairTable, row: dict[str, int],
                pair_row: dict[tuple[str, str], int]) -> None:
        """Drop pairs with a member gone or a normalised co-located throughput below 1."""
        for jid, other in list(self._partner.items()):
            if jid not in row or (other is not None and other not in row):
                self._partner.pop(jid, None)
                if other is not None:
                    self._partner.pop(other, None)
                continue
            if other is None:
                continue
            combo = (jid, other) if row[jid] < row[other] else (other, jid)
            k = pair_row.get(combo)
            if k is None or _normalised(inp, pairs, k - len(inp.job_ids)) < 1.0:
                self._partner.pop(jid, None)
                self._partner.pop(other, None)

    def _pair_up(self, inp: AllocationInput, row: dict[str, int],
                 pair_row: dict[tuple[str, str], int]) -> None:
        free = [jid for jid in inp.job_ids if jid not in self._partner]
        for _ in range(len(free)):
            if len(free) < 2:
                break
            a, b = self._rng.sample(free, 2)
            combo = (a, b) if row[a] < row[b] else (b, a)
            if inp.gpus[row[a]] != inp.gpus[row[b]] or combo not in pair_row:
                continue
            free.remove(a)
            free.remove(b)
            self._partner[a], self._partner[b] = b, a
        for jid in free:
            self._partner[jid] = None


def _normalised(inp: AllocationInput, pairs: PairTable, k: int) -> float:
    total = 0.0
    for j in range(len(inp.types)):
        for pos in (0, 1):
            together = pairs.throughputs[k, j, pos]
            if together <= 0:
                return 0.0
            total += together / inp.throughputs[pairs.members[k, pos], j]
    return total
