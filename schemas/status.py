"""`Status`: why a job is where it is ("why is my job pending"), and who decided it."""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


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
    # Queues (docs/queues.md): waiting, its queue is at its nominal quota and in no cohort.
    WAITING_FOR_QUEUE_QUOTA = "waiting_for_queue_quota"
    # Waiting: its queue would borrow, but its cohort has no idle quota to lend it.
    WAITING_FOR_QUOTA_IN_COHORT = "waiting_for_quota_in_cohort"
    # Waiting: its queue would go past its borrowing limit.
    BORROWING_LIMIT = "borrowing_limit"
    # Waiting: the cohort has idle quota, but lending limits keep it from borrowers.
    LENDING_LIMIT = "lending_limit"
    # Waiting: within its queue's nominal quota, which is lent out; being taken back.
    WAITING_FOR_RECLAIM = "waiting_for_reclaim"
    # Preempted: a lender took back the quota its queue had borrowed (the reason names it).
    RECLAIMED_BY_QUEUE = "reclaimed_by_queue"
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
    # When a waiting job should start (cluster time), as the scheduler's latest forecast has
    # it (services.scheduler.forecast); None: no forecast, or not within its horizon. Left
    # out of a dump while None, so every message without a forecast (every transition's
    # status) is byte for byte what it was, and readers that predate the field still read it.
    forecast_start_s: float | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("forecast_start_s", 0.0) is None:
            del data["forecast_start_s"]
        return data

    def __str__(self) -> str:
        pos = "" if self.queue_position is None else f" (queue position {self.queue_position})"
        return f"{self.code.value}: {self.reason}{pos} [{self.decided_by}]"
