from __future__ import annotations

from policies.base import JobView
from policies.mechanisms.ordered import Key, OrderedPolicy


class Srsf(OrderedPolicy):
    name = "srsf"
    description = (
        "Shortest remaining GPU-service (time × GPUs) first, preemptive (Muri's `shortest-gpu`)"
    )
    keys_fall = True  # remaining time only shrinks while a job runs

    def key(self, job: JobView) -> Key:
        return (job.remaining_s * job.gpus, job.spec.submit_time_s, job.job_id)
