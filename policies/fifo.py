from __future__ import annotations

from policies.base import JobView
from policies.mechanisms.ordered import Key, OrderedPolicy


class Fifo(OrderedPolicy):
    name = "fifo"
    description = "First in, first out by submit time; later jobs may fill GPUs the head cannot use"
    keys_fall = True  # a fixed key

    def key(self, job: JobView) -> Key:
        return (job.spec.submit_time_s, job.job_id)
