from __future__ import annotations

from policies.mechanisms.ordered import Key, TimeLeftOrder
from schemas.job import JobSpec


class Srsf(TimeLeftOrder):
    name = "srsf"
    description = (
        "Shortest remaining GPU-service (time × GPUs) first, preemptive (Muri's `shortest-gpu`)"
    )

    def key_left(self, spec: JobSpec, left_s: float) -> Key:
        return (left_s * spec.gpus, spec.submit_time_s, spec.job_id)
