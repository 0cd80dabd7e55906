"""What the queue layer looks like now: each queue's quota, use, borrowing, lending, waiting
jobs and fair-share standing (`loom queues`, the `loom_queue_*` Prometheus series).

One model serves both readers: the scheduler answers `loom queues` with it on
`loomctl.scheduler.queues` and publishes it after its cycles on `loom.sched.queues`
(`loom.queue.status.v1`), where the metrics service reads it. It is an observation, never a
decision: the decision digest and replay leave it out. Kueue's ClusterQueue status
(`flavorsUsage`, `pendingWorkloads`, `admittedWorkloads`, `fairSharing`) is the model, restated
for GPUs; docs/queues.md ("Operator view") says what each number means.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas.job import MAX_GPU_TYPES, MAX_GPUS, MAX_NAME, JobId, Name
from schemas.queues import MAX_QUEUES, Reclaim
from schemas.status import StatusCode
from schemas.tenants import MAX_TENANTS


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QuotaUsage(_Body):
    """One resource of a queue: GPUs of any type (`gpu_type` "*") or one GPU type."""

    gpu_type: str = Field(min_length=1, max_length=MAX_NAME)  # "*" (ANY_TYPE): any type
    nominal: int = Field(ge=0, le=MAX_GPUS)
    borrowing_limit: int | None = Field(default=None, ge=0, le=MAX_GPUS)  # None: no limit
    lending_limit: int | None = Field(default=None, ge=0, le=MAX_GPUS)  # None: all it has
    used: int = Field(default=0, ge=0)  # GPUs its running jobs hold
    borrowed: int = Field(default=0, ge=0)  # used beyond its nominal quota
    lent: int = Field(default=0, ge=0)  # of its nominal quota, what borrowers hold


class WaitCount(_Body):
    """How many of a queue's waiting jobs wait for one reason code, and the first of them
    (admission order) with its reason as `loom status` shows it."""

    code: StatusCode
    jobs: int = Field(ge=1)
    job_id: JobId
    reason: str = Field(max_length=2048)


class QueueState(_Body):
    name: Name
    cohort: Name | None = None
    tenants: tuple[Name, ...] = Field(default=(), max_length=MAX_TENANTS)
    weight: float = 1.0
    priority: int = 0
    reclaim: Reclaim = "any"
    min_runtime_s: float = 0.0
    quotas: tuple[QuotaUsage, ...] = Field(default=(), max_length=MAX_GPU_TYPES)  # file order
    running_jobs: int = Field(default=0, ge=0)
    pending_jobs: int = Field(default=0, ge=0)  # queued or preempted, suspended included
    pending_gpus: int = Field(default=0, ge=0)  # the GPUs those jobs ask for
    usage_gpu_s: float = 0.0  # decayed GPU-seconds (policies.mechanisms.fairshare)
    rank: int | None = None  # 1: first for borrowed GPUs in its cohort; None: no cohort
    share_factor: float = 1.0  # Slurm's fair-share factor within its cohort, in (0, 1]
    waiting: tuple[WaitCount, ...] = Field(default=(), max_length=len(StatusCode))  # most first

    @property
    def used(self) -> int:
        return sum(q.used for q in self.quotas)


class CohortState(_Body):
    name: Name
    half_life_s: float
    queues: tuple[Name, ...] = ()


class Unqueued(_Body):
    """Jobs of tenants in no queue: outside the layer, only the tenant rules apply."""

    running_jobs: int = Field(default=0, ge=0)
    used_gpus: int = Field(default=0, ge=0)
    pending_jobs: int = Field(default=0, ge=0)


class QueueStatus(_Body):
    """The queues as of `at` (cluster time) after cycle `cycle`. Without a tenants file, or
    with one that has no `[queues.*]`, `queues` is empty and `tenants_file` says which. A
    published status of many queues comes in `parts` messages, `part` 0, 1, ..., each with
    its share of the queues (and every cohort and `unqueued` in part 0)."""

    at: float
    cycle: int = Field(ge=0)
    tenants_file: bool = False
    cohorts: tuple[CohortState, ...] = Field(default=(), max_length=MAX_QUEUES)
    queues: tuple[QueueState, ...] = Field(default=(), max_length=MAX_QUEUES)
    unqueued: Unqueued | None = None
    part: int = Field(default=0, ge=0)
    parts: int = Field(default=1, ge=1)

    @property
    def configured(self) -> bool:
        return bool(self.queues)
