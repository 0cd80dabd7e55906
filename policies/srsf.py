from __future__ import annotations

from policies.base import JobView, Snapshot, running_remaining_s
from policies.mechanisms.ordered import Key, OrderedPolicy


class Srsf(OrderedPolicy):
    name = "srsf"
    description = (
        "Shortest remaining GPU-service (time × GPUs) first, preemptive (Muri's `shortest-gpu`)"
    )
    keys_fall = True  # remaining time only shrinks while a job runs
    views_for_keys = False  # a running job's key from its record (`running_key`)

    def key(self, job: JobView) -> Key:
        return (job.remaining_s * job.gpus, job.spec.submit_time_s, job.job_id)

    def running_key(self, job_id: str, snap: Snapshot) -> Key:
        known = running_remaining_s(snap, job_id)
        if known is None:  # no view-free progress: from the view, as every policy
            return super().running_key(job_id, snap)
        spec, remaining_s = known
        return (remaining_s * spec.gpus, spec.submit_time_s, job_id)
