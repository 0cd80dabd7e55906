"""The chaos test's stream audit catches what it claims to (a pure check on made-up streams)."""

from __future__ import annotations

from typing import Any

import pytest

from domain import causes
from schemas.events import JobFinished, JobTransition, Launch, PlanDecided, Stop
from schemas.job import JobState
from tests.builders import make_job
from tests.chaos.harness import Message, audit


def launch(job: str, *gpus: int) -> Launch:
    return Launch(job_id=job, spec=make_job(job).build(), placement=(("n0", tuple(gpus)),))


def plan(launches: tuple[Launch, ...] = (), stops: tuple[str, ...] = (), term: int = 0
         ) -> PlanDecided:
    return PlanDecided(cycle=1, launches=launches, term=term,
                       stops=tuple(Stop(job_id=j, reason="preempted") for j in stops))


def done(job: str) -> list[Any]:
    return [JobFinished(job_id=job, node_id="n0", iterations_done=100),
            JobTransition(job_id=job, state=JobState.FINISHED, previous=JobState.RUNNING,
                          cause="completed", reason=causes.COMPLETED)]


def stream(*bodies: Any, skip: int | None = None) -> list[Message]:
    seqs = [s for s in range(1, len(bodies) + 2) if s != skip]
    return [Message(seq, "loom.x", b) for seq, b in zip(seqs, bodies, strict=False)]


CLEAN = [plan((launch("a", 0), launch("b", 1))), *done("a"), plan((launch("c", 0),)),
         plan((launch("b", 2),), ("b",), term=1), *done("b"), *done("c")]
CASES: dict[str, tuple[list[Message], str | None]] = {
    "clean run (a migration, a reused GPU, a new term)": (stream(*CLEAN), None),
    "a launch onto a held GPU": (stream(plan((launch("a", 0),)), plan((launch("b", 0),)),
                                        *done("a"), *done("b")), "double_booked"),
    "two launches on one GPU in one plan": (
        stream(plan((launch("a", 0), launch("b", 0))), *done("a"), *done("b")),
        "double_booked"),
    "a job finished twice": (stream(plan((launch("a", 0),)), *done("a"), *done("a")),
                             "finished"),
    "a finish reported twice": (
        stream(plan((launch("a", 0),)), *done("a"),
               JobFinished(job_id="a", node_id="n0", iterations_done=100)), "finish_reports"),
    "a job that never ends": (stream(plan((launch("a", 0),)), plan((launch("b", 1),)),
                                     *done("a")), "unfinished"),
    "a gap in the stream": (stream(*CLEAN, skip=3), "gaps"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_audit(case: str) -> None:
    messages, broken = CASES[case]
    jobs = sorted({b.job_id for m in messages if isinstance(b := m.body, JobTransition)}
                  | {x.job_id for m in messages if isinstance(m.body, PlanDecided)
                     for x in m.body.launches})
    report = audit(messages, jobs)
    assert report.ok is (broken is None), report
    if broken == "double_booked":
        assert report.double_booked
    elif broken in ("finished", "finish_reports"):
        assert set(getattr(report, broken).values()) != {1}
        assert report.suspects == ["a"]
    elif broken is not None:
        assert getattr(report, broken)
