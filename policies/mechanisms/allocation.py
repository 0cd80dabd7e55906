"""The frozen input of a time-share allocation (Gavel's policies, algorithms.md §3a).

Rows are the active jobs in admission order (Gavel sorts by job id, which is arrival order);
columns are GPU types in sorted order (Gavel's `flatten`). Throughputs are iterations per second
of the job alone at its GPU count on each type; a job without a profile runs at its trace speed
on every type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.base import JobView, Snapshot
from policies.mechanisms.lp import FloatArray
from schemas.cluster import ClusterSpec
from schemas.throughputs import ThroughputTable

# Gavel visits worker types fastest first; other types follow in name order.
_GAVEL_ORDER = ("v100", "p100", "k80")
GAVEL_PRICES = {"v100": 0.74, "p100": 0.43, "k80": 0.135}  # $/GPU-hour, Gavel's utils.py (GCP)


def gpu_prices(cluster: ClusterSpec, types: tuple[str, ...]) -> FloatArray:
    """$/GPU-hour per type: the nodes' own price, else Gavel's GCP price, else 1."""
    given = {n.gpu_type: n.gpu_price_per_hour for n in cluster.nodes
             if n.gpu_price_per_hour is not None}
    return np.array([given.get(t, GAVEL_PRICES.get(t, 1.0)) for t in types])


def gpu_type_order(cluster: ClusterSpec) -> tuple[str, ...]:
    present = cluster.gpus_by_type
    known = [t for t in _GAVEL_ORDER if t in present]
    return tuple(known + sorted(t for t in present if t not in _GAVEL_ORDER))


@dataclass(frozen=True)
class AllocationInput:
    job_ids: tuple[str, ...]
    types: tuple[str, ...]
    throughputs: FloatArray  # (m, n) iterations/s
    gpus: FloatArray  # (m,) scale factors
    weights: FloatArray  # (m,) priority weights
    remaining: FloatArray  # (m,) iterations left
    age_s: FloatArray  # (m,) seconds since submission
    capacity: FloatArray  # (n,) GPUs per type
    prices: FloatArray  # (n,) $/GPU-hour per type
    deadline_s: FloatArray  # (m,) absolute deadline (SLO), inf when none
    now: float

    @classmethod
    def from_snapshot(cls, snap: Snapshot, types: tuple[str, ...]) -> AllocationInput:
        jobs = list(snap.jobs.values())  # the scheduler keeps them in admission order
        m, n = len(jobs), len(types)
        tput = np.array([[job_rate(job, t) for t in types] for job in jobs]).reshape(m, n)
        by_type = snap.cluster.gpus_by_type
        return cls(
            job_ids=tuple(j.job_id for j in jobs),
            types=types,
            throughputs=tput,
            gpus=np.array([j.gpus for j in jobs], dtype=np.float64),
            weights=np.array([j.spec.weight for j in jobs], dtype=np.float64),
            remaining=np.array([j.remaining_iterations for j in jobs], dtype=np.float64),
            age_s=np.array([snap.now - j.spec.submit_time_s for j in jobs], dtype=np.float64),
            capacity=np.array([by_type[t] for t in types], dtype=np.float64),
            prices=gpu_prices(snap.cluster, types),
            deadline_s=np.array([np.inf if j.spec.deadline_s is None else j.spec.deadline_s
                                 for j in jobs], dtype=np.float64),
            now=snap.now,
        )

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.job_ids), len(self.types)

    def reference_column(self, gpu_type: str = "v100") -> FloatArray:
        """Every type given one type's throughput (Gavel's agnostic variants); its own if absent."""
        col = self.types.index(gpu_type) if gpu_type in self.types else 0
        return np.repeat(self.throughputs[:, col:col + 1], len(self.types), axis=1)

    def even_split(self) -> FloatArray:
        """Every job an equal share of every type, rows scaled so the fullest sums to 1.

        Gavel's "proportional" allocation, the reference of max-min fairness.
        """
        m = len(self.job_ids)
        x = np.tile(self.capacity / m, (m, 1))
        top = float(x.sum(axis=1).max()) if m else 1.0
        return x / top if top > 0 else x

    def isolated_split(self) -> FloatArray:
        """Gavel's "isolated" allocation, the reference of finish-time fairness: the cluster
        split evenly in GPUs (1/M of each type), in time shares of each job's GPU count, rows
        capped at 1."""
        m, _ = self.shape
        x: FloatArray = np.tile(self.capacity / m, (m, 1)) / self.gpus[:, None]
        out: FloatArray = x / np.maximum(x.sum(axis=1), 1.0)[:, None]
        return out


def job_rate(job: JobView, gpu_type: str) -> float:
    """Iterations/s of a job alone on `gpu_type` (its trace speed if it has no profile)."""
    rates = job.spec.throughputs
    own = 1.0 / job.spec.iteration_time_s
    return own if rates is None else rates.get(gpu_type, own)


def pair_rates(profile: ThroughputTable | None, a: JobView, b: JobView, gpu_type: str
               ) -> tuple[float, float] | None:
    """Iterations/s of a and b sharing GPUs of `gpu_type`, if the profile knows the pair."""
    if profile is None or a.gpus != b.gpus or a.spec.job_type is None or b.spec.job_type is None:
        return None
    return profile.pair(gpu_type, (a.spec.job_type, a.gpus), (b.spec.job_type, b.gpus))


@dataclass(frozen=True)
class PairTable:
    """Candidate pairs for space sharing: jobs of the same GPU count whose co-located
    throughputs are profiled (Gavel pairs only equal scale factors)."""

    combos: list[tuple[str, str]]
    members: np.ndarray[Any, np.dtype[np.int64]]  # (p, 2) row of each member in the input
    throughputs: FloatArray  # (p, n, 2) iterations/s of each member, per GPU type

    @classmethod
    def build(cls, snap: Snapshot, inp: AllocationInput, profile: ThroughputTable | None
              ) -> PairTable:
        combos: list[tuple[str, str]] = []
        members: list[tuple[int, int]] = []
        rates: list[list[tuple[float, float]]] = []
        jobs = [snap.jobs[j] for j in inp.job_ids]
        for i, a in enumerate(jobs):
            for k in range(i + 1, len(jobs)):
                b = jobs[k]
                row = [pair_rates(profile, a, b, t) or (0.0, 0.0) for t in inp.types]
                if any(x > 0 and y > 0 for x, y in row):
                    combos.append((a.job_id, b.job_id))
                    members.append((i, k))
                    rates.append(row)
        n = len(inp.types)
        return cls(combos, np.array(members, dtype=np.int64).reshape(-1, 2),
                   np.array(rates, dtype=np.float64).reshape(-1, n, 2))
