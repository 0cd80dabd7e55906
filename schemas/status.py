"""`Status`: why a job is where it is ("why is my job pending"), and who decided it."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict


class StatusCode(enum.StrEnum):
    RUNNING = "running"
    # Waiting: the policy ranked other jobs first and the cluster filled up before this one.
    WAITING_FOR_PRIORITY = "waiting_for_priority"
    # Waiting: enough GPUs are free in total but not in one consolidated block.
    WAITING_FOR_CONSOLIDATED_GPUS = "waiting_for_consolidated_gpus"
    # Waiting: fewer GPUs free than the job needs.
    WAITING_FOR_GPUS = "waiting_for_gpus"
    # Waiting: the policy chose not to run it this cycle for its own reason (see detail).
    WAITING_BY_POLICY = "waiting_by_policy"
    REJECTED_TOO_LARGE = "rejected_too_large"
    REJECTED_INVALID = "rejected_invalid"
    # Rejected: the policy cannot schedule this kind of job (see reason).
    REJECTED_BY_POLICY = "rejected_by_policy"
    # Waiting: its tenant holds its GPU quota (`max_gpus` in the tenants file).
    WAITING_FOR_TENANT_QUOTA = "waiting_for_tenant_quota"
    # Waiting: its tenant is above its weighted fair share while other tenants wait.
    WAITING_FOR_FAIR_SHARE = "waiting_for_fair_share"
    # Rejected: its tenant already has `max_queued` waiting jobs, or it needs more GPUs than
    # its tenant may hold (`max_gpus`).
    REJECTED_BY_QUOTA = "rejected_by_quota"
    # Waiting: an operator suspended it (`loom suspend`); `loom resume` gives it back.
    SUSPENDED = "suspended"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"  # by an operator (`loom cancel`); the job's state is failed


class Status(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    code: StatusCode
    reason: str
    decided_by: str
    queue_position: int | None = None

    def __str__(self) -> str:
        pos = "" if self.queue_position is None else f" (queue position {self.queue_position})"
        return f"{self.code.value}: {self.reason}{pos} [{self.decided_by}]"
