from __future__ import annotations

from policies.base import JobView, RunningJobs, Snapshot
from policies.mechanisms.ordered import Key, OrderedPolicy


class Fifo(OrderedPolicy):
    name = "fifo"
    description = "First in, first out by submit time; later jobs may fill GPUs the head cannot use"
    keys_fall = True  # a fixed key
    views_for_keys = False  # from the spec (`running_key`)

    def key(self, job: JobView) -> Key:
        return (job.spec.submit_time_s, job.job_id)

    def running_key(self, job_id: str, snap: Snapshot) -> Key:
        spec_of = snap.running.spec_of if isinstance(snap.running, RunningJobs) else None
        spec = spec_of(job_id) if spec_of is not None else None
        if spec is None:  # no view-free spec: as every policy
            return super().running_key(job_id, snap)
        return (spec.submit_time_s, job_id)  # the key, from the spec: no view made
