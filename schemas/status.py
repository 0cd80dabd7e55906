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
