"""Publishes each trace job on the submit subject at its submit time.

One timer at a time (the next arrival). Given a sequence the injector sorts it; given any
other iterable (a trace read as it goes) it takes the jobs in the order they come, which must
be submission order, and holds only the next one, so a million-job trace is never in memory
at once. Each submission's event id is derived from the job id, so a restarted injector cannot
submit a job twice (JetStream drops the duplicate).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence

from schemas import subjects
from schemas.events import Envelope
from schemas.job import JobSpec, SubmitJob
from services.runtime.effects import PRIORITY_INPUT, Effect, Publish, SetTimer
from services.runtime.service import CoreDefaults, Subscribe


class InjectorCore(CoreDefaults):
    name = "injector"

    def __init__(self, jobs: Iterable[JobSpec], id_prefix: str = "submit") -> None:
        if isinstance(jobs, Sequence):
            jobs = sorted(jobs, key=lambda j: j.submit_time_s)  # stable: ties in given order
        self._jobs: Iterator[JobSpec] = iter(jobs)
        self.id_prefix = id_prefix
        self._next: JobSpec | None = next(self._jobs, None)
        # Why injection stopped early (a streamed trace out of order); the run reports it.
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self._next is None

    def subscriptions(self) -> Sequence[Subscribe]:
        return ()

    def start(self, now: float) -> list[Effect]:
        return self._arm(now)

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        raise TypeError(f"injector does not handle {env.type}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        spec = self._next
        if spec is None:
            raise KeyError(key)  # no arrival is armed once the trace is exhausted
        self._next = following = next(self._jobs, None)
        if following is not None and following.submit_time_s < spec.submit_time_s:
            self._next = None
            self.error = (
                f"job {following.job_id!r} is submitted at {following.submit_time_s!r} s, "
                f"before the job ahead of it ({spec.job_id!r} at {spec.submit_time_s!r} s): "
                "a streamed trace must be in submission order")
        effects: list[Effect] = [Publish(subjects.JOB_SUBMIT, SubmitJob.from_spec(spec),
                                         event_id=f"{self.id_prefix}.{spec.job_id}")]
        return effects + self._arm(now)

    def _arm(self, now: float) -> list[Effect]:
        if self._next is None:
            return []
        return [SetTimer("arrival", max(now, self._next.submit_time_s), PRIORITY_INPUT)]
