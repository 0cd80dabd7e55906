from __future__ import annotations

from policies.base import JobView
from policies.mechanisms.ordered import Key, OrderedPolicy


class Srtf(OrderedPolicy):
    name = "srtf"
    description = "Shortest remaining time first, preemptive (Muri's `shortest`; needs durations)"
    keys_fall = True  # remaining time only shrinks while a job runs

    def key(self, job: JobView) -> Key:
        return (job.remaining_s, job.spec.submit_time_s, job.job_id)
