"""Every outcome counted: rejections by reason, and both measures of waiting (the time to a
job's first start, and every second it spent pending, after preemptions too)."""

from __future__ import annotations

import pytest

from domain.overhead import parse_overhead
from schemas.events import JobTransitionV1, envelope
from schemas.job import JobSpec, JobState
from schemas.status import Status, StatusCode
from services.metrics.core import MetricsCore
from tests.builders import make_job

Q, R, P, F, J = (JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED, JobState.FINISHED,
                 JobState.REJECTED)

# (time, job, state, previous) after each job's submission at its spec's time
Script = list[tuple[float, str, JobState, JobState | None]]


def _play(jobs: dict[str, JobSpec], script: Script,
          codes: dict[str, StatusCode] | None = None, overhead: str = "none",
          causes: dict[tuple[float, str], str] | None = None) -> MetricsCore:
    m = MetricsCore(total_gpus=4, overhead=parse_overhead(overhead))
    seen: set[str] = set()
    for at, job, state, prev in script:
        code = (codes or {}).get(job)
        status = None if code is None else Status(code=code, reason="r", decided_by="admission")
        cause = (causes or {}).get((at, job), "x")
        body = JobTransitionV1(job_id=job, state=state, previous=prev, cause=cause,
                               status=status, spec=None if job in seen else jobs.get(job))
        seen.add(job)
        m.handle(envelope(body, event_id=f"e{at}{job}{state}", occurred_at=at,
                          producer="scheduler", causation_id=None), at)
    return m


@pytest.mark.parametrize(("script", "first_start", "pending"), [
    pytest.param([(0, "a", Q, None), (10, "a", R, Q), (50, "a", F, R)], 10, 10,
                 id="one wait before the start"),
    pytest.param([(0, "a", Q, None), (0, "a", R, Q), (20, "a", P, R), (70, "a", R, P),
                  (90, "a", F, R)], 0, 50, id="started at once, then preempted for 50 s"),
    pytest.param([(0, "a", Q, None), (5, "a", R, Q), (10, "a", P, R), (30, "a", R, P),
                  (40, "a", P, R), (100, "a", R, P), (110, "a", F, R)], 5, 85,
                 id="every wait counts"),
])
def test_time_to_first_start_and_time_pending(script: Script, first_start: float,
                                              pending: float) -> None:
    m = _play({"a": make_job("a").submit(0).build()}, script)
    s = m.summary()
    assert s["avg_first_start_s"] == s["avg_queueing_s"] == first_start
    assert s["avg_pending_s"] == pending and m.jobs["a"].pending_s == pending


def test_pending_averages_only_finished_jobs() -> None:
    jobs = {j: make_job(j).submit(0).build() for j in ("a", "b")}
    m = _play(jobs, [(0, "a", Q, None), (0, "b", Q, None), (0, "a", R, Q), (10, "a", F, R),
                     (10, "b", R, Q), (20, "b", P, R)])
    assert m.summary()["avg_pending_s"] == 0  # b has not finished: its wait is still open


@pytest.mark.parametrize(("codes", "expected"), [
    ({}, {}),
    ({"big": StatusCode.REJECTED_TOO_LARGE}, {"rejected_too_large": 1}),
    ({"big": StatusCode.REJECTED_TOO_LARGE, "greedy": StatusCode.REJECTED_BY_QUOTA,
      "huge": StatusCode.REJECTED_TOO_LARGE},
     {"rejected_too_large": 2, "rejected_by_quota": 1}),
])
def test_rejections_are_counted_by_reason(codes: dict[str, StatusCode],
                                          expected: dict[str, int]) -> None:
    jobs = {j: make_job(j).gpus(8).build() for j in codes}
    m = _play(jobs, [(0, j, J, None) for j in codes], codes)
    s = m.summary()
    assert s["rejected"] == len(codes) and s["rejected_by"] == expected


def test_a_rejection_without_a_valid_spec_is_counted_too() -> None:
    m = _play({}, [(0, "junk", J, None)], {"junk": StatusCode.REJECTED_INVALID})
    assert m.summary()["rejected_by"] == {"rejected_invalid": 1}


# Each preemption loses the run's work since its start (GPUs x seconds; the scheduler knows
# of no later checkpoint) and each resumption the overhead model's restart time (x GPUs).
LOSS_SCRIPT: Script = [(0, "a", Q, None), (0, "b", Q, None), (10, "a", R, Q), (40, "a", P, R),
                       (50, "a", R, P), (60, "a", P, R), (70, "a", R, P), (80, "a", F, R),
                       (0, "b", R, Q), (100, "b", P, R), (120, "b", R, P), (130, "b", F, R)]


@pytest.mark.parametrize(("overhead", "a_s", "b_s"), [
    ("none", 2 * (30 + 10), 1 * 100),
    ("flat:5", 2 * (30 + 10) + 2 * 2 * 5, 1 * 100 + 1 * 5),
])
def test_gpu_hours_lost_to_preemption_per_tenant(overhead: str, a_s: float, b_s: float
                                                 ) -> None:
    jobs = {"a": make_job("a").gpus(2).tenant("ta").build(),
            "b": make_job("b").gpus(1).tenant("tb").build()}
    m = _play(jobs, LOSS_SCRIPT, overhead=overhead,
              causes={(100.0, "b"): "preempted: reclaimed by queue 'q'"})
    summary = m.summary()
    tenants = summary["tenants"]
    assert isinstance(tenants, dict)
    assert tenants["ta"]["preemption_lost_gpu_h"] == pytest.approx(a_s / 3600)
    assert tenants["tb"]["preemption_lost_gpu_h"] == pytest.approx(b_s / 3600)
    assert tenants["ta"]["reclaim_lost_gpu_h"] == 0
    assert tenants["tb"]["reclaim_lost_gpu_h"] == pytest.approx(100 / 3600)
    assert summary["preemption_lost_gpu_h"] == pytest.approx((a_s + b_s) / 3600)
    assert summary["reclaims"] == 1
