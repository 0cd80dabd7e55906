from __future__ import annotations

from policies.mechanisms.ordered import Key, TimeLeftOrder
from schemas.job import JobSpec


class Srtf(TimeLeftOrder):
    name = "srtf"
    description = "Shortest remaining time first, preemptive (Muri's `shortest`; needs durations)"

    def key_left(self, spec: JobSpec, left_s: float) -> Key:
        return (left_s, spec.submit_time_s, spec.job_id)
