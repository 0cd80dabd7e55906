"""Earliest deadline first, as ElasticFlow's artifact runs it (`edf_sim_allocation`).

Every cycle (slotted, 60 s by default), the active jobs are taken in deadline order
(best-effort jobs, without a deadline, last; ties by submission). Each takes its base quota,
min(largest GPU count it can use, cluster GPUs), when that many GPUs are free; otherwise the
largest GPU count of its profile that the free GPUs allow; otherwise it waits. Elastic jobs
thus shrink and grow from cycle to cycle; a job without a scaling profile runs at its requested
size or not at all. No admission control: late jobs run on and count as missed.

The artifact plans each job's future too (a free-GPU profile over time) to estimate its end;
only the allocation at the current instant is ever enacted, and it depends only on the GPUs
the earlier-deadline jobs took now, which is what this module computes.
"""

from __future__ import annotations

import math

from policies.base import Fitter, JobView, Plan, Policy, Snapshot
from schemas.status import Status, StatusCode


def deadline_key(job: JobView) -> tuple[float, float, str]:
    deadline = job.spec.deadline_s
    late = math.inf if deadline is None or job.spec.best_effort else deadline
    return (late, job.spec.submit_time_s, job.job_id)


def edf_share(job: JobView, free: int, cluster_gpus: int) -> int:
    """GPUs the job takes now with `free` GPUs left (0: it waits)."""
    levels = job.spec.gpu_levels
    quota = min(max(levels), cluster_gpus)
    if free >= quota:
        return quota
    fitting = [g for g in levels if g <= free]
    return max(fitting) if fitting else 0


class Edf(Policy):
    name = "edf"
    description = "Earliest deadline first with elastic shares (ElasticFlow's EDF baseline)"
    placement = "count"
    replan = "slot"

    def __init__(self) -> None:
        self._position: dict[str, int] = {}
        self._last: Plan | None = None

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        plan = Plan()
        total = snap.cluster.total_gpus
        order = sorted(snap.jobs.values(), key=deadline_key)
        for job in order:
            share = edf_share(job, fit.free_gpus, total)
            slots = None
            # The count placer fits any share that the free GPUs allow; smaller levels are a
            # fallback should a topology-aware placer refuse one.
            for g in sorted((x for x in job.spec.gpu_levels if x <= share), reverse=True):
                slots = fit.try_place(job.job_id, g)
                if slots is not None:
                    break
            if slots is None:
                plan.blocked[job.job_id] = Status(
                    code=StatusCode.WAITING_FOR_GPUS,
                    reason=f"earlier deadlines hold the GPUs ({fit.free_gpus} free)",
                    decided_by=self.name)
                continue
            plan.run[job.job_id] = slots
        waiting = [j.job_id for j in order if j.job_id not in plan.run]
        self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        self._last = plan
        plan.free_gpus = fit.free_gpus
        return plan

    def job_removed(self, job_id: str) -> None:
        self._position.pop(job_id, None)

    def waiting_status(self, job_id: str) -> Status:
        blocked = self._last.blocked.get(job_id) if self._last is not None else None
        reason = blocked.reason if blocked is not None else "earlier deadlines hold the GPUs"
        return Status(code=StatusCode.WAITING_FOR_PRIORITY, reason=reason, decided_by=self.name,
                      queue_position=self._position.get(job_id))
