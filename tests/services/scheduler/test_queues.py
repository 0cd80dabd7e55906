"""The scheduler with queues: holds and reclaims show in statuses and causes, reclaim waits for
a minimum runtime with a wake-up, a job no queue could ever hold is rejected at submit."""

from __future__ import annotations

from typing import Any

import policies
from schemas.events import JobTransition, PlanDecided
from schemas.job import JobSpec, JobState
from schemas.status import StatusCode
from services.runtime.effects import Effect, Publish, SetTimer
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from tests.builders import cluster, make_job, submit
from tests.policies.mechanisms.queue_fixtures import queue_file


def core(policy: str = "fifo", **specs: dict[str, Any]) -> SchedulerCore:
    return SchedulerCore(cluster(2, 4), policies.make(policy),
                         SchedulerConfig(tenants=queue_file(specs)))


def plan(effects: list[Effect]) -> tuple[list[str], list[str]]:
    """(launched, stopped) job ids."""
    for e in effects:
        if isinstance(e, Publish) and isinstance(e.body, PlanDecided):
            return ([x.job_id for x in e.body.launches], [s.job_id for s in e.body.stops])
    return [], []


def job(jid: str, queue: str, gpus: int = 1) -> JobSpec:
    return make_job(jid).tenant(queue).gpus(gpus).runs_for(1000).build()


def test_a_borrowing_hold_is_what_loom_status_shows() -> None:
    sched = core(a={"nominal": 4, "borrowing_limit": 2}, b={"nominal": 4})
    for i in range(8):
        submit(sched, job(f"a{i}", "a"))
    assert sorted(plan(sched.on_timer("cycle", 0.0))[0]) == [f"a{i}" for i in range(6)]
    status = sched.status("a6")
    assert status.code is StatusCode.BORROWING_LIMIT and status.decided_by == "queues"
    assert status.reason == "queue 'a' would hold 7 GPUs, over its nominal 4 + borrowing limit 2"
    assert status.queue_position is not None
    assert sched.jobs["a6"].state is JobState.QUEUED  # held, not rejected


def test_a_lender_takes_its_quota_back_and_the_victims_say_why() -> None:
    sched = core(a={"nominal": 4}, b={"nominal": 4})
    for i in range(8):
        submit(sched, job(f"a{i}", "a"))
    assert len(plan(sched.on_timer("cycle", 0.0))[0]) == 8  # a borrows b's idle quota
    submit(sched, job("b0", "b", 2), 10.0)
    effects = sched.on_timer("cycle", 10.0)
    launched, stopped = plan(effects)
    assert launched == ["b0"] and sorted(stopped) == ["a0", "a1"]
    preempted = [e.body for e in effects if isinstance(e, Publish)
                 and isinstance(e.body, JobTransition) and e.body.state is JobState.PREEMPTED]
    assert {t.job_id for t in preempted} == {"a0", "a1"}
    for t in preempted:
        assert t.reason is not None and t.reason.kind == "preempted"
        assert t.cause == "preempted: reclaimed by queue 'b'"
    status = sched.status("a0")
    assert status.code is StatusCode.RECLAIMED_BY_QUEUE
    assert status.reason == ("reclaimed by queue 'b': its jobs wait within its nominal quota, "
                             "which queue 'a' had borrowed")


def test_reclaim_waits_for_the_minimum_runtime_with_a_wakeup() -> None:
    sched = core(a={"nominal": 4, "min_runtime_s": 300}, b={"nominal": 4})
    for i in range(8):
        submit(sched, job(f"a{i}", "a"))
    plan(sched.on_timer("cycle", 0.0))
    submit(sched, job("b0", "b"), 100.0)
    effects = sched.on_timer("cycle", 100.0)
    assert plan(effects) == ([], [])
    assert sched.status("b0").code is StatusCode.WAITING_FOR_RECLAIM
    assert [e.at for e in effects if isinstance(e, SetTimer) and e.key == "wakeup"] == [300.0]
    launched, stopped = plan(sched.on_timer("wakeup", 300.0) + sched.on_timer("cycle", 300.0))
    assert launched == ["b0"] and stopped == ["a0"]


def test_a_job_its_queue_could_never_hold_is_rejected_at_submit() -> None:
    sched = core(a={"nominal": 2, "borrowing_limit": 1}, b={"nominal": 4})
    [rejected] = submit(sched, job("wide", "a", 4))
    assert rejected.state is JobState.REJECTED and rejected.status is not None
    assert rejected.status.code is StatusCode.REJECTED_BY_QUOTA
    assert rejected.status.reason == ("asks for 4 GPUs; queue 'a' may hold at most 3 (nominal "
                                      "quota and what it may borrow)")
    assert submit(sched, job("fits", "a", 3))[0].state is JobState.QUEUED
