"""The job lifecycle as a literal transition table; every transition is recorded."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.causes import Cause
from schemas.job import JobState

Q, R, P = JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED
F, X, J = JobState.FINISHED, JobState.FAILED, JobState.REJECTED

TRANSITIONS: frozenset[tuple[JobState | None, JobState]] = frozenset(
    {
        (None, Q),  # admitted
        (None, J),  # rejected at admission
        (Q, R),  # started
        (Q, J),  # declined after admission (e.g. a deadline became infeasible)
        (Q, X),  # cancelled / failed before starting
        (R, R),  # migrated or resized
        (R, P),  # preempted; requeued off a lost node; a failed trainer's backoff (retry)
        (R, F),  # finished
        (R, X),  # failed: cancelled, or its trainer failed once too often
        (P, R),  # resumed
        (P, F),  # its node, taken for lost, completed it before the requeue reached it
        (P, X),  # cancelled while waiting (also during a retry's backoff)
    }
)


class IllegalTransition(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    previous: JobState | None
    state: JobState
    cause: Cause


def check(previous: JobState | None, state: JobState, job_id: str) -> None:
    if (previous, state) not in TRANSITIONS:
        was = previous.value if previous else "new"
        raise IllegalTransition(f"job {job_id}: {was} → {state.value} is not a legal transition")
