"""Publishes each trace job on the submit subject at its submit time.

One timer at a time (the next arrival), so a 100k-job trace costs no memory up front. Each
submission's event id is derived from the job id, so a restarted injector cannot submit a job
twice (JetStream drops the duplicate).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from schemas import subjects
from schemas.events import Envelope
from schemas.job import JobSpec, SubmitJob
from services.runtime.effects import PRIORITY_INPUT, Effect, Publish, SetTimer
from services.runtime.service import CoreDefaults, Subscribe


class InjectorCore(CoreDefaults):
    name = "injector"

    def __init__(self, jobs: Sequence[JobSpec], id_prefix: str = "submit") -> None:
        self.jobs = sorted(jobs, key=lambda j: j.submit_time_s)
        self.id_prefix = id_prefix
        self.next = 0

    @property
    def done(self) -> bool:
        return self.next >= len(self.jobs)

    def subscriptions(self) -> Sequence[Subscribe]:
        return ()

    def start(self, now: float) -> list[Effect]:
        return self._arm(now)

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        raise TypeError(f"injector does not handle {env.type}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        spec = self.jobs[self.next]
        self.next += 1
        effects: list[Effect] = [Publish(subjects.JOB_SUBMIT, SubmitJob.from_spec(spec),
                                         event_id=f"{self.id_prefix}.{spec.job_id}")]
        return effects + self._arm(now)

    def _arm(self, now: float) -> list[Effect]:
        if self.done:
            return []
        return [SetTimer("arrival", max(now, self.jobs[self.next].submit_time_s), PRIORITY_INPUT)]
