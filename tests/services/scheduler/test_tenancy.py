"""The scheduler with a tenants file: holds show in the job's status, quotas reject at submit."""

from __future__ import annotations

import policies
from schemas.events import JobFinished, PlanDecided
from schemas.job import JobSpec, JobState
from schemas.status import StatusCode
from schemas.tenants import TenantLimits, TenantsConfig
from services.runtime.effects import Effect, Publish
from services.scheduler.core import SchedulerConfig, SchedulerCore
from tests.builders import cluster, deliver, make_job, submit


def core(policy: str = "fifo", **limits: TenantLimits) -> SchedulerCore:
    return SchedulerCore(cluster(1, 4), policies.make(policy),
                         SchedulerConfig(tenants=TenantsConfig(tenants=limits)))


def launched(effects: list[Effect]) -> list[str]:
    return [launch.job_id for e in effects if isinstance(e, Publish)
            and isinstance(e.body, PlanDecided) for launch in e.body.launches]


def job(jid: str, tenant: str, gpus: int = 1) -> JobSpec:
    return make_job(jid).tenant(tenant).gpus(gpus).runs_for(10).build()


def test_a_job_over_its_tenants_gpu_quota_waits_with_the_reason_then_runs() -> None:
    sched = core(a=TenantLimits(max_gpus=2))
    for spec in (job("a0", "a"), job("a1", "a"), job("a2", "a"), job("b0", "b")):
        submit(sched, spec)
    assert launched(sched.on_timer("cycle", 0.0)) == ["a0", "a1", "b0"]
    status = sched.status("a2")
    assert status.code is StatusCode.WAITING_FOR_TENANT_QUOTA
    assert status.reason == "tenant 'a' holds 2 of its 2 GPUs (max_gpus); the job needs 1 more"
    assert status.decided_by == "tenancy" and status.queue_position is not None
    assert sched.jobs["a2"].state is JobState.QUEUED  # held, not rejected
    deliver(sched, JobFinished(job_id="a0", node_id="n0", iterations_done=10), 10.0)
    assert launched(sched.on_timer("cycle", 10.0)) == ["a2"]
    assert sched.status("a2").code is StatusCode.RUNNING


def test_submissions_beyond_the_queued_jobs_quota_are_rejected_with_the_reason() -> None:
    sched = core(a=TenantLimits(max_queued=2))
    assert [t.state for t in submit(sched, job("a0", "a"))] == [JobState.QUEUED]
    assert [t.state for t in submit(sched, job("a1", "a"))] == [JobState.QUEUED]
    [rejected] = submit(sched, job("a2", "a"))
    assert rejected.state is JobState.REJECTED and rejected.status is not None
    assert rejected.status.code is StatusCode.REJECTED_BY_QUOTA
    assert rejected.status.reason == ("tenant 'a' already has 2 waiting jobs, its limit "
                                      "(max_queued = 2)")
    assert sched.status("a2").code is StatusCode.REJECTED_BY_QUOTA
    assert [t.state for t in submit(sched, job("b0", "b"))] == [JobState.QUEUED]  # no limit
    # Running jobs do not count: once a's jobs run, it may queue two more.
    assert launched(sched.on_timer("cycle", 0.0)) == ["a0", "a1", "b0"]
    assert [t.state for t in submit(sched, job("a3", "a", 4), 1.0)] == [JobState.QUEUED]
    assert [t.state for t in submit(sched, job("a4", "a", 4), 1.0)] == [JobState.QUEUED]
    assert submit(sched, job("a5", "a"), 1.0)[0].state is JobState.REJECTED


def test_fair_share_hold_is_what_loom_status_shows() -> None:
    sched = core("srtf", a=TenantLimits(weight=3))
    for i in range(4):
        submit(sched, job(f"a{i}", "a"))
        submit(sched, job(f"b{i}", "b"))
    assert sorted(launched(sched.on_timer("cycle", 0.0))) == ["a0", "a1", "a2", "b0"]
    # srtf walks a3 before b0: a3 would take a above its 3 GPUs while b had not had its one.
    status = sched.status("a3")
    assert status.code is StatusCode.WAITING_FOR_FAIR_SHARE
    assert status.reason == ("tenant 'a' would hold 4 GPUs, above its fair share of 3.0, "
                             "while 'b' below theirs wait")
    # b1 was never reached: the cluster was full, which is what its status says.
    assert sched.status("b1").code is StatusCode.WAITING_FOR_PRIORITY
