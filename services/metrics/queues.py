"""The queues as the scheduler last published them (`loom.sched.queues`), and the reclaims
each queue's jobs suffered, for the `loom_queue_*` Prometheus series.

The scheduler publishes its queues' status after a cycle when it changed (each status may
come in parts, in order, each with its own queues): the queues of the latest are kept. Reclaims are
counted from the transitions themselves (a preemption whose cause is a reclaim), by the
victim's tenant, and reported under the tenant's queue as the latest status has it, so a
reclaim counts even if it happened before the metrics service heard of the queues.
"""

from __future__ import annotations

from collections import Counter

from schemas.queue_status import QueueState, QueueStatus


class QueueBoard:
    def __init__(self) -> None:
        self.rows: dict[str, QueueState] = {}  # queue → its latest state, in the file's order
        self.at: float | None = None  # cluster time of the latest status
        self.reclaims_by_tenant: Counter[str] = Counter()

    def status(self, body: QueueStatus) -> None:
        if self.at is not None and body.at < self.at:
            return  # an older status delivered late: what it says is stale
        if body.part == 0:  # a new status begins: queues it no longer has (a scheduler
            self.rows = {}  # restarted with another tenants file) are dropped
        self.at = body.at
        for row in body.queues:
            self.rows[row.name] = row

    def reclaimed(self, tenant: str) -> None:
        """A job of `tenant` was preempted by a reclaim."""
        self.reclaims_by_tenant[tenant] += 1

    def reclaims(self) -> dict[str, int]:
        """Reclaims per queue (victims' queues), every known queue listed."""
        out = dict.fromkeys(self.rows, 0)
        for row in self.rows.values():
            out[row.name] = sum(self.reclaims_by_tenant[t] for t in row.tenants)
        return out
