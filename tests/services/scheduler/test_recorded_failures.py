"""Failures a trace records (`JobSpec.fail_at`), replayed: the scheduler retries a recorded
failure whatever its retry budget and fails the job for good at the last one, through the
same path as a trainer's own failure; a live cluster refuses such a job. End to end, a Philly
job restarted twice uses its recorded GPU time, and an Acme FAILED job ends failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import policies
from domain import causes
from loom.builders import ServeOptions, scheduler_for
from schemas.events import JobFinished, PlanDecided
from schemas.job import JobSpec, JobState, SubmitJob
from schemas.status import StatusCode
from services.runtime.effects import Effect, Publish, SetTimer
from services.scheduler.build import build_scheduler
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.intake import NO_REPLAY
from services.scheduler.liveness import RetryPolicy, retry_key
from tests.builders import cluster, deliver, make_job, simulate, transitions
from tests.traces.production_builders import attempt, philly_job, write_acme, write_philly_log
from traces import load_trace


def timers(effects: list[Effect]) -> dict[Any, float]:
    return {e.key: e.at for e in effects if isinstance(e, SetTimer)}


def failing(marks: tuple[float, ...], iterations: int = 1000) -> JobSpec:
    return make_job("a").gpus(4).runs_for(iterations).build().model_copy(
        update={"fail_at": marks})


def replaying(spec: JobSpec, retry: RetryPolicy) -> SchedulerCore:
    """A simulation's scheduler (its nodes replay recorded failures) running `spec` on n0."""
    core = SchedulerCore(cluster(2, 4), policies.make("fifo"),
                         SchedulerConfig(retry=retry, replays_failures=True))
    deliver(core, SubmitJob.from_spec(spec), 0.0)
    core.on_timer("cycle", 0.0)
    assert core.jobs["a"].state is JobState.RUNNING
    return core


def report(core: SchedulerCore, mark: float, *, permanent: bool = False,
           failure: str | None = None, now: float = 0.0) -> list[Effect]:
    return deliver(core, JobFinished(
        job_id="a", node_id="n0", iterations_done=mark, permanent=permanent,
        failure=failure or causes.recorded_failure(mark, core.jobs["a"].spec.iterations)), now)


def test_recorded_failures_are_retried_past_the_budget_then_fail_the_job_for_good() -> None:
    """A budget of one attempt (the first failure of its own would fail the job): the two
    recorded restarts are retried all the same, with the usual backoff, each from its mark."""
    core = replaying(failing((300.0, 600.0, 1000.0)), RetryPolicy(max_attempts=1, base_s=10))
    now = 0.0
    for n, (mark, delay) in enumerate(((300.0, 10.0), (600.0, 20.0)), start=1):
        now += mark
        effects = report(core, mark, now=now)
        (t,) = transitions(effects)
        assert t.state is JobState.PREEMPTED
        assert t.reason.kind == "retry" and t.reason.fault == "recorded-failure"
        assert t.cause == (f"trainer failed on n0 ({causes.recorded_failure(mark, 1000)}); "
                           f"restart {n} as recorded, at {now + delay:g}")
        assert timers(effects)[retry_key("a")] == now + delay
        assert core.status("a").decided_by == "retry"
        now += delay
        core.on_timer(retry_key("a"), now)
        (plan,) = [e.body for e in core.on_timer("cycle", now) if isinstance(e, Publish)
                   and isinstance(e.body, PlanDecided)]
        (launch,) = plan.launches
        assert launch.iterations_done == mark  # resumed where the recorded attempt ended
    effects = report(core, 1000.0, permanent=True, now=now + 400.0)
    (t,) = transitions(effects)
    assert (t.state, t.reason.kind, t.reason.fault) == (JobState.FAILED, "failed",
                                                        "recorded-failure")
    assert t.cause.startswith("failed: recorded failure: ")
    assert retry_key("a") not in timers(effects)
    status = core.status("a")
    assert status.code is StatusCode.FAILED
    assert status.reason == f"{causes.recorded_failure(1000.0, 1000)} (not retried)"


@pytest.mark.parametrize(("mark", "failure"), [
    (300.0, "rank 0 exited with 1"),  # the trainer's own failure, at a mark or not
    (123.0, None),  # said to be recorded, but at no mark of the job
])
def test_a_failure_the_trace_does_not_record_keeps_to_the_budget(
        mark: float, failure: str | None) -> None:
    core = replaying(failing((300.0, 1000.0)), RetryPolicy(max_attempts=1))
    (t,) = transitions(report(core, mark, failure=failure, now=50.0))
    assert t.state is JobState.FAILED and core.status("a").reason.startswith(
        "trainer failed 1 time(s)")


@pytest.mark.parametrize("build", [
    lambda: SchedulerCore(cluster(2, 4), policies.make("fifo"), SchedulerConfig()),
    lambda: build_scheduler("fifo", cluster(2, 4)),
    lambda: scheduler_for(ServeOptions(service="scheduler", nats_url="nats://x:4222",
                                       cluster=cluster(2, 4))),
], ids=["config-default", "build_scheduler-default", "loom-serve-scheduler"])
def test_a_live_cluster_refuses_a_job_that_replays_failures(build: Any) -> None:
    core = build()
    (t,) = transitions(deliver(core, SubmitJob.from_spec(failing((300.0,))), 0.0))
    assert t.state is JobState.REJECTED and "fail_at" in t.cause
    status = core.status("a")
    assert (status.code, status.reason) == (StatusCode.REJECTED_INVALID, NO_REPLAY)
    (ok,) = transitions(deliver(core, SubmitJob.from_spec(make_job("b").build()), 0.0))
    assert ok.state is JobState.QUEUED  # a job without marks is what it always was


# -- end to end: a real in-memory simulation of trace files --------------------------------

def test_a_philly_job_restarted_twice_completes_with_its_recorded_gpu_time(
        tmp_path: Path) -> None:
    runs = (("2017-10-03 07:00:00", "2017-10-03 07:10:00"),  # 600 s, failed
            ("2017-10-03 07:20:00", "2017-10-03 07:40:00"),  # 1,200 s, failed
            ("2017-10-03 08:00:00", "2017-10-03 08:30:00"))  # 1,800 s, passed
    path = write_philly_log(tmp_path, [philly_job(0, status="Pass", attempts=[
        attempt(start, end, gpus=4) for start, end in runs])])
    trace = load_trace(path, replay_failures=True)
    (spec,) = trace.jobs
    assert spec.fail_at == (600.0, 1800.0)
    result = simulate(trace.jobs, "fifo", cluster(2, 4), overhead="none")
    (job,) = result.jobs
    assert job.state is JobState.FINISHED
    assert job.preemptions == 2  # the two restarts
    assert job.gpu_s == pytest.approx(4 * 3600.0)  # the GPU time the real job used
    backoff = RetryPolicy().delay("", 1) + RetryPolicy().delay("", 2)
    assert job.jct_s == pytest.approx(3600.0 + backoff)
    s = result.summary
    assert (s["finished"], s["failed"], s["failures_replayed"]) == (1, 0, 2)

    plain = simulate(load_trace(path).jobs, "fifo", cluster(2, 4), overhead="none")
    assert plain.jobs[0].preemptions == 0 and plain.summary["failures_replayed"] == 0
    assert plain.jobs[0].gpu_s == pytest.approx(job.gpu_s)  # the same GPU time, in one run


def test_an_acme_failed_job_ends_failed_at_its_recorded_time(tmp_path: Path) -> None:
    path = write_acme(tmp_path, [{"state": "FAILED", "duration": "7200"},
                                 {"state": "COMPLETED", "duration": "3600"}])
    result = simulate(load_trace(path, replay_failures=True).jobs, "fifo", cluster(2, 8),
                      overhead="none")
    failed, done = sorted(result.jobs, key=lambda j: j.job_id)
    assert (failed.state, done.state) == (JobState.FAILED, JobState.FINISHED)
    assert failed.start_s == 0.0 and failed.end_s == pytest.approx(7200.0)
    assert failed.jct_s is None  # no completion time: it failed
    assert failed.cause.startswith("failed: recorded failure: ")
    assert failed.gpu_s == pytest.approx(8 * 7200.0)
    s = result.summary
    assert (s["jobs"], s["finished"], s["failed"], s["failures_replayed"]) == (2, 1, 1, 1)
    assert s["unfinished"] == 0 and s["makespan_s"] == pytest.approx(7200.0)
