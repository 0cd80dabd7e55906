from __future__ import annotations

from policies.base import JobView, Snapshot, running_specs
from policies.mechanisms.ordered import Key, OrderedPolicy
from schemas.job import JobSpec


class Fifo(OrderedPolicy):
    name = "fifo"
    description = "First in, first out by submit time; later jobs may fill GPUs the head cannot use"
    keys_fall = True  # a fixed key
    views_for_keys = False  # from the spec (`running_key`)

    def key(self, job: JobView) -> Key:
        return _submitted(job.spec)

    def running_key(self, job_id: str, snap: Snapshot) -> Key:
        spec_of = running_specs(snap)
        spec = spec_of(job_id) if spec_of is not None else None
        if spec is None:  # no view-free spec: as every policy
            return super().running_key(job_id, snap)
        return _submitted(spec)  # no view made


def _submitted(spec: JobSpec) -> Key:
    return (spec.submit_time_s, spec.job_id)
