"""A job's outcome as the metrics service builds it, and the percentile convention its
statistics use."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.job import JobState


@dataclass(slots=True)
class JobOutcome:
    job_id: str
    tenant: str
    model: str
    gpus: int
    submit_s: float
    deadline_s: float | None
    best_effort: bool
    state: JobState
    work_s: float = 0.0  # solo run time at the requested GPUs
    start_s: float | None = None
    end_s: float | None = None  # when it finished, or failed
    preemptions: int = 0
    cause: str = ""
    contention: float | None = None  # average active jobs over its lifetime (≥ 1)
    total_gpus: int = 0
    gpu_s: float = 0.0  # GPU-seconds it held (per-tenant shares)
    # GPU-seconds its preemptions cost: each run's work since its last checkpoint (taken as
    # the run's start, an upper bound) and each restart's overhead; those by reclaim apart.
    lost_gpu_s: float = 0.0
    reclaim_lost_gpu_s: float = 0.0
    # Seconds spent waiting (queued, or preempted and not yet restarted), every wait counted;
    # `waiting_since` is when the current wait began (None: not waiting now).
    pending_s: float = 0.0
    waiting_since: float | None = None

    @property
    def jct_s(self) -> float | None:
        """Submission to completion: a job that failed has none."""
        if self.end_s is None or self.state is not JobState.FINISHED:
            return None
        return self.end_s - self.submit_s

    @property
    def queueing_s(self) -> float | None:
        """Time to first start: submission to the first launch (later waits not counted)."""
        return None if self.start_s is None else self.start_s - self.submit_s

    @property
    def ftf_rho(self) -> float | None:
        """Finish-time fairness (Themis): JCT over the time it would take with its fair share.

        The fair share is 1/N̄ of the cluster, N̄ the average number of active jobs while it
        was in the system, capped at the GPUs it asked for. ρ ≤ 1: it did at least as well as
        a dedicated 1/N̄ slice would have.
        """
        jct = self.jct_s
        if jct is None or self.contention is None or self.work_s <= 0:
            return None
        share = min(1.0, self.total_gpus / (self.contention * self.gpus))
        return jct * share / self.work_s

    @property
    def met_deadline(self) -> bool | None:
        if self.deadline_s is None or self.best_effort:
            return None
        return self.state is JobState.FINISHED and self.end_s is not None and (
            self.end_s <= self.deadline_s
        )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Muri's calc.py convention: sorted[floor(q·n)], clamped to the last element."""
    n = len(sorted_values)
    return sorted_values[min(n - 1, math.floor(q * n))]
