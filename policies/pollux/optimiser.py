"""Pollux's objective and its exact optimiser over GPU counts.

A job's term of the objective is (s + 1e-3)^p of its penalised speedup s; the allocation
maximises the power mean of the terms (p = -1). Pollux searches job x node replica matrices
with a genetic algorithm (NSGA-II, population 100, 100 generations per round). Here the
objective is separable given each job's GPU count (a job of g GPUs is packed into
ceil(g / node size) nodes, its fastest shape), so the best GPU counts under the cluster's GPU
total are found exactly by dynamic programming over (job, GPUs used), a multiple-choice
knapsack (`best_counts`); `policies.pollux.packing` then places them on nodes.
`tests/policies/pollux/test_pollux.py` compares this with a genetic search using Pollux's
operators on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

P = -1.0  # power-mean exponent: more negative is fairer
RESTART_S = 30.0  # Pollux's restart delay in the penalty
OFFSET = 1e-3  # Pollux adds it to every speedup before the power mean
MAX_NODES = 16  # Pollux's limit on the nodes one job spans
_TIE = 1e-9  # prefer earlier jobs (Pollux's order) between equally good allocations

SpeedupFn = Callable[[int, int], float]  # (nodes, GPUs) → speedup


@dataclass(frozen=True)
class JobTerms:
    """What the optimiser needs of one job.

    `counts`: GPU counts it may get (ascending, > 0); `speedup(nodes, gpus)`: its speedup;
    `current`: GPUs it holds now (0 if waiting); `factor`: its restart penalty.
    """

    job_id: str
    counts: tuple[int, ...]
    speedup: SpeedupFn
    current: int = 0
    factor: float = 1.0


def penalty(age_s: float, restarts: int) -> float:
    """Pollux's restart penalty factor for a job that would be (re)started now."""
    return max(age_s - restarts * RESTART_S, 0.0) / (age_s + RESTART_S)


def job_value(term: JobTerms, gpus: int, nodes: int, scale: float, moved: bool) -> float:
    """One job's term (s + 1e-3)^p of the power mean, on `gpus` GPUs over `nodes` nodes."""
    s = 0.0 if gpus == 0 else term.speedup(nodes, gpus) * scale
    if moved:
        s *= term.factor
    return float((s + OFFSET) ** P)


def power_mean(values: Sequence[float]) -> float:
    """Pollux's objective (to maximise) from the jobs' terms (s + 1e-3)^p."""
    return float((sum(values) / len(values)) ** (1.0 / P)) if values else 0.0


def shape_nodes(gpus: int, node_gpus: int) -> int:
    return -(-gpus // node_gpus) if gpus else 0


def best_counts(terms: Sequence[JobTerms], total_gpus: int, node_gpus: int, scale: float
                ) -> list[int]:
    """GPU counts maximising the power mean with at most `total_gpus` GPUs in all (exact).

    Minimises sum_j (s_j + 1e-3)^p, separable in the counts: dynamic programming over jobs
    with the GPUs used so far as the state. Jobs earlier in `terms` win ties.
    """
    g = np.arange(total_gpus + 1)
    dp = np.full(total_gpus + 1, np.inf)
    dp[0] = 0.0
    choices: list[tuple[np.ndarray, np.ndarray]] = []
    n = len(terms)
    for rank, term in enumerate(terms):
        options = [0] + [c for c in term.counts if c <= total_gpus]
        a = np.asarray(options)
        bias = _TIE * (n - rank)
        f = np.asarray([job_value(term, c, shape_nodes(c, node_gpus), scale, c != term.current)
                        - (bias if c else 0.0) for c in options])
        src = g[None, :] - a[:, None]
        cand = np.where(src >= 0, dp[np.clip(src, 0, None)] + f[:, None], np.inf)
        k = np.argmin(cand, axis=0)
        dp = cand[k, g]
        choices.append((a, k))
    used = int(np.argmin(dp))
    counts = [0] * n
    for j in range(n - 1, -1, -1):
        a, k = choices[j]
        counts[j] = int(a[k[used]])
        used -= counts[j]
    return counts
