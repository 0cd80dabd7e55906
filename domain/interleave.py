"""Multi-resource interleaving (Muri, SIGCOMM'22): how fast jobs run when they share GPUs.

Each iteration of a job passes through stages that use different resources: data loading
(storage/CPU), forward/backward (GPU), gradient communication (network). Jobs co-located on the
same GPUs are staggered so that each resource serves one job at a time; the group's iteration
time is the steady-state period of that pipeline, minimised over the order of the jobs.

Muri's traces give three stage times per job and Muri models four resource slots; the period
is then found by its 2-round recurrence over a 4-slot pipeline (each job one slot behind the
previous one). With as many stage times as slots, the classic formula applies:
period = Σ_slot max_job t[job][(slot − position) mod K].

Muri's testbed calibration multiplies a group's period by a factor per group size
(`GROUP_FACTOR`); its solo calibration (1.015) belongs to the `muri` overhead model.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

Stages = tuple[float, ...]

SLOTS = 4  # Muri's --multi_resource default
MAX_GROUP = 4  # Muri's --packing_num default
# Muri jobs.py itertime_overhead_list, relative to the raw period: 1.33/1.015, 1.5/1.015, ...
GROUP_FACTOR: dict[int, float] = {2: 1.33 / 1.015, 3: 1.5 / 1.015, 4: 1.37 / 1.015}


def _period_three_stages(order: Sequence[Stages]) -> float:
    """Muri's recurrence for 3 stage times (data, compute, communication) in 4 slots."""
    n = len(order)
    f = [0.0] * (2 * SLOTS + 1)
    period = 0.0
    for i in range(2 * SLOTS):
        best = f[i + 1]
        j = (i + 1) % SLOTS
        if j < n:
            best = max(best, f[i] + order[j][2])
        j = (i + 2) % SLOTS
        if j < n:
            best = max(best, f[i] + order[j][1])
        j = (i + 3) % SLOTS
        if i > 0 and j < n:
            best = max(best, f[i - 1] + order[j][0])
        f[i + 1] = best
        if i >= SLOTS and math.isclose(f[i + 1] - f[i - 3], f[i] - f[i - 4], rel_tol=1e-3):
            period = f[i + 1] - f[i - 3]
            break
    return period if period > 0 else f[2 * SLOTS] - f[SLOTS]


def _period_k_stages(order: Sequence[Stages]) -> float:
    k = len(order[0])
    return sum(max(job[(slot - pos) % k] for pos, job in enumerate(order)) for slot in range(k))


@functools.lru_cache(maxsize=1 << 16)
def raw_period(group: tuple[Stages, ...]) -> float:
    """Best-ordering pipeline period of a group (2+ jobs), before calibration.

    `group` should be in a canonical order (e.g. sorted) so the cache is shared: the result
    does not depend on the order given, since every order is tried.
    """
    if len(group) < 2:
        raise ValueError("a group has at least two jobs")
    if len(group) > MAX_GROUP:
        raise ValueError(f"at most {MAX_GROUP} jobs interleave")
    three = len(group[0]) == 3 and SLOTS == 4
    if not three and any(len(g) != SLOTS for g in group):
        raise ValueError(f"stage times must have 3 or {SLOTS} entries per job")
    period_of = _period_three_stages if three else _period_k_stages
    best = min(period_of(order) for order in itertools.permutations(group))
    if three and len(group) == 2:
        # Two jobs can also alternate whole phases: data of one under compute+comm of the other.
        a, b = group
        best = min(best, max(a[0], b[1] + b[2]) + max(b[0], a[1] + a[2]))
    return best


def group_iteration_time(group: Sequence[Stages]) -> float:
    """Calibrated iteration time of every member of an interleaved group (2–4 jobs)."""
    key = tuple(sorted(group))
    return raw_period(key) * GROUP_FACTOR[len(key)]


def used_ratio(group: Sequence[Stages]) -> float:
    """Fraction of the SLOTS resource slots the group keeps busy (Muri's matching weight)."""
    busy = sum(sum(stages) for stages in group)
    period = group_iteration_time(group)
    return busy / (period * SLOTS) if period > 0 else 0.0  # all-zero stages: nothing to gain


# -- many groups at once (numpy) -------------------------------------------------------------
# Matching weighs every pair of candidate groups: 500,000 pairs for 1,000 jobs. These mirror
# the scalar functions above operation for operation, so results are bit-identical.


def _isclose(x: np.ndarray, y: np.ndarray, rel: float) -> np.ndarray:
    close: np.ndarray = np.abs(x - y) <= rel * np.maximum(np.abs(x), np.abs(y))
    return close  # math.isclose with abs_tol=0


def _batch_period_three(order: list[np.ndarray]) -> np.ndarray:
    """`_period_three_stages` for many groups: order[pos] has shape (m, 3)."""
    n = len(order)
    m = order[0].shape[0]
    f = [np.zeros(m) for _ in range(2 * SLOTS + 1)]
    period = np.zeros(m)
    done = np.zeros(m, dtype=bool)
    for i in range(2 * SLOTS):
        best = f[i + 1]
        j = (i + 1) % SLOTS
        if j < n:
            best = np.maximum(best, f[i] + order[j][:, 2])
        j = (i + 2) % SLOTS
        if j < n:
            best = np.maximum(best, f[i] + order[j][:, 1])
        j = (i + 3) % SLOTS
        if i > 0 and j < n:
            best = np.maximum(best, f[i - 1] + order[j][:, 0])
        f[i + 1] = best
        if i >= SLOTS:
            hit = ~done & _isclose(f[i + 1] - f[i - 3], f[i] - f[i - 4], 1e-3)
            period = np.where(hit, f[i + 1] - f[i - 3], period)
            done |= hit
    out: np.ndarray = np.where(period > 0, period, f[2 * SLOTS] - f[SLOTS])
    return out


def batch_group_iteration_time(stages: np.ndarray) -> np.ndarray:
    """`group_iteration_time` for m groups of k jobs with 3 stages each: shape (m, k, 3)."""
    m, k, s = stages.shape
    if not 2 <= k <= MAX_GROUP or s != 3:
        raise ValueError("groups of 2–4 jobs with 3 stage times each")
    best = np.full(m, np.inf)
    for perm in itertools.permutations(range(k)):
        best = np.minimum(best, _batch_period_three([stages[:, p, :] for p in perm]))
    if k == 2:
        a, b = stages[:, 0, :], stages[:, 1, :]
        pair = np.maximum(a[:, 0], b[:, 1] + b[:, 2]) + np.maximum(b[:, 0], a[:, 1] + a[:, 2])
        best = np.minimum(best, pair)
    return best * GROUP_FACTOR[k]


def batch_used_ratio(stages: np.ndarray) -> np.ndarray:
    """`used_ratio` for m groups: shape (m, k, 3)."""
    busy = np.zeros(stages.shape[0])
    for job in range(stages.shape[1]):  # same summation order as the scalar version
        busy = busy + (((0.0 + stages[:, job, 0]) + stages[:, job, 1]) + stages[:, job, 2])
    period = batch_group_iteration_time(stages)
    safe = np.where(period > 0, period, 1.0)
    ratio: np.ndarray = np.where(period > 0, busy / (safe * SLOTS), 0.0)
    return ratio
