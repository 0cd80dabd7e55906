"""ElasticFlow's planner model: what the planner takes of a job (`Need`), the free-GPU profile
it plans into (`Steps`), and what it gives back (`JobPlan`; `Growing` during the leftover
allocation, `Allotted` after a cycle). The reference planner and the fast path share them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import compress
from typing import cast

import numpy as np

from policies.base import JobView

NO_DEADLINE = float(sys.maxsize)  # the artifact's "no deadline" (best-effort jobs)
TABLE_MAX = 64  # the throughput tables' largest GPU count

# models.get_max_gpu, T4 and A100 folded into one rule: the two tables share only bert
# (T4 batch 384 → 16; A100 batch 64 → 8, 128 → 16) and deepspeech2 (T4 batch 320 → 32,
# 640 → 64; A100: the batch size, 32 or 64), so the GPU type need not be known.
_CAP_BY_MODEL = {"cifar10": 16, "yolov3": 4, "ncf": 1, "bert": 16}
_CAP_BY_BATCH = {
    ("bert", 64): 8, ("deepspeech2", 320): 32, ("gpt2", 128): 16, ("gpt2", 256): 32,
    ("inception3", 64): 16, ("inception3", 128): 32, ("resnet50", 64): 32, ("vgg16", 64): 32,
}  # fmt: skip


def artifact_max_gpus(model: str, batch_size: int | None) -> int:
    """The largest GPU count ElasticFlow lets a job of this model and batch size use."""
    batch = batch_size or TABLE_MAX
    if (model, batch) in _CAP_BY_BATCH:
        return _CAP_BY_BATCH[(model, batch)]
    if model in _CAP_BY_MODEL:
        return _CAP_BY_MODEL[model]
    return min(batch, TABLE_MAX)


@cache
def _fit_table(levels: tuple[int, ...]) -> tuple[int, ...]:
    """For f = 0 … the top level: the largest level within f GPUs (0: none)."""
    fit = [0] * (levels[-1] + 1)
    for g in levels:
        fit[g:] = [g] * (len(fit) - g)
    return tuple(fit)


@dataclass(frozen=True)
class Need:
    """What the planner needs of one job: its work, deadline and speed at each GPU count."""

    job_id: str
    left: float  # iterations still to do
    deadline: float  # NO_DEADLINE for best-effort jobs
    rate: Mapping[int, float]  # iterations/s of the whole job at each usable GPU count
    levels: tuple[int, ...] = field(init=False)  # ascending
    # fit[f]: the largest level within f free GPUs (0: none), for f up to the top level
    fit: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        levels = tuple(sorted(self.rate))
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "fit", _fit_table(levels))

    @classmethod
    def of(cls, job: JobView, known: dict[str, Mapping[int, float]] | None = None) -> Need:
        """The job's need now; `known` keeps each job's speeds (fixed by its spec) between
        cycles."""
        deadline = job.spec.deadline_s
        late = NO_DEADLINE if deadline is None or job.spec.best_effort else deadline
        rate = known.get(job.job_id) if known is not None else None
        if rate is None:
            rate = cls.speeds(job)
            if known is not None:
                known[job.job_id] = rate
        # Active jobs always have work left; a rounding remainder is still work to plan.
        return cls(job.job_id, max(job.remaining_iterations, 1e-9), late, rate)

    @staticmethod
    def speeds(job: JobView) -> dict[int, float]:
        """Iterations/s of the whole job at each GPU count it may use."""
        spec = job.spec
        cap = artifact_max_gpus(spec.model, spec.batch_size) if spec.scaling else spec.gpus
        rate: dict[int, float] = {}
        for g in spec.gpu_levels:
            if g <= cap:
                scaled = spec.scaling.get(g) if spec.scaling is not None else None
                rate[g] = scaled if scaled is not None else 1.0 / spec.iteration_time_at(g)
        if not rate:  # a cap below every level of the table: its smallest level
            g = spec.gpu_levels[0]
            rate[g] = 1.0 / spec.iteration_time_at(g)
        return rate

    def next_level(self, gpus: int) -> int:
        """The next larger GPU count (the smallest from 0); `gpus` itself at the top."""
        for g in self.levels:
            if g > gpus:
                return g if gpus == 0 or gpus in self.rate else gpus
        return gpus

    def fitting(self, free: int) -> int:
        """The largest GPU count within `free` GPUs, 0 if none (`get_last_level(free + 1)`)."""
        fit = self.fit
        if free >= len(fit):
            return fit[-1]
        return fit[free] if free > 0 else 0


# A free-GPU profile: ascending breakpoints and the free GPUs from each until the next (the
# last value holds for ever). The first breakpoint is the planning instant.
Steps = tuple[list[float], list[int]]


def merged(ts: Sequence[float], vs: Sequence[int]) -> Steps:
    """Drop breakpoints that repeat the previous value (the artifact's `merge_dict`)."""
    changed = [a != b for a, b in zip(vs[1:], vs, strict=False)]
    return ([ts[0], *compress(ts[1:], changed)], [vs[0], *compress(vs[1:], changed)])


@dataclass
class JobPlan:
    """A job's planned GPUs over time (breakpoint → GPUs) and the profile it leaves."""

    met: bool  # the planned (unaligned) end meets the deadline
    alloc: dict[float, int]  # merged, in time order
    end: float  # slot-aligned end: the GPUs are held until here
    real_end: float
    # The profile once the job's GPUs are taken: lists before merging, or the compiled
    # kernel's arrays, already merged. Read only when the plan is committed, so made lazily.
    raw: Steps | tuple[np.ndarray, np.ndarray]
    _merged: Steps | None = None

    @property
    def steps(self) -> Steps:
        if self._merged is None:
            ts, vs = self.raw
            if isinstance(ts, np.ndarray):
                self._merged = ts.tolist(), cast(np.ndarray, vs).tolist()
            else:
                self._merged = merged(ts, cast(list[int], vs))
        return self._merged

    def first_change(self, now: float) -> float | None:
        return next((t for t in self.alloc if t > now), None)


def gpu_seconds(alloc: Mapping[float, int], end: float) -> float:
    """GPU time of a plan: each breakpoint's GPUs until the next one, the last until `end`."""
    spent = 0.0
    last_t: float | None = None
    last_g = 0
    for t, g in alloc.items():
        if last_t is not None:
            spent += last_g * (t - last_t)
        last_t, last_g = t, g
    assert last_t is not None
    return spent + last_g * (end - last_t)


@dataclass
class Growing:
    """One job during leftover allocation: its GPUs now, its plan, its next step."""

    need: Need
    plan: JobPlan
    gpus: int
    step: int = 0  # the next level's GPU count
    marginal: float = 0.0
    trial: JobPlan | None = None  # its plan at the next level


@dataclass(frozen=True)
class Allotted:
    """A job after a cycle's planning: its GPUs now, and when its plan next changes them."""

    need: Need
    gpus: int
    next_change: float | None
