"""Node faults in the scheduler core: lost nodes, requeue, reconcile, retries with backoff."""

from __future__ import annotations

from typing import Any

import pytest

import policies
from domain.causes import launch_timeout_failure
from schemas import subjects
from schemas.causes import Cause
from schemas.events import (
    JobFinished,
    JobTransition,
    NodeCommand,
    NodeHeartbeat,
    NodeInfo,
    NodeStatus,
    OperatorCommand,
    PlanDecided,
    envelope,
)
from schemas.job import JobState, SubmitJob
from schemas.status import StatusCode
from services.metrics.core import MetricsCore
from services.metrics.prometheus import exposition, registry_for
from services.runtime.effects import CancelTimer, Effect, Publish, SetTimer
from services.scheduler.core import SchedulerConfig, SchedulerCore
from services.scheduler.liveness import (
    LivenessConfig,
    RetryPolicy,
    launch_key,
    lost_key,
    retry_key,
)
from tests.builders import cluster, deliver, make_job


def published(effects: list[Effect], kind: type) -> list[Any]:
    return [e.body for e in effects if isinstance(e, Publish) and isinstance(e.body, kind)]


def timers(effects: list[Effect]) -> dict[Any, float]:
    return {e.key: e.at for e in effects if isinstance(e, SetTimer)}


def beat(node: str, *jobs: str, interval_s: float = 5.0) -> NodeHeartbeat:
    return NodeHeartbeat(node_id=node, jobs=jobs, interval_s=interval_s)


def core_with(*jobs: tuple[str, int], nodes: int = 2, retry: RetryPolicy | None = None,
              misses: int = 3) -> SchedulerCore:
    """FIFO on `nodes` × 4 GPUs, jobs (id, GPUs) of 1,000 one-second iterations admitted at 0
    and placed by one cycle (consolidated: the first fits on n0, and so on)."""
    cfg = SchedulerConfig(liveness=LivenessConfig(misses=misses), retry=retry or RetryPolicy())
    core = SchedulerCore(cluster(nodes, 4), policies.make("fifo"), cfg)
    for jid, gpus in jobs:
        deliver(core, SubmitJob.from_spec(make_job(jid).gpus(gpus).runs_for(1000).build()), 0.0)
    core.on_timer("cycle", 0.0)
    return core


def node_of(core: SchedulerCore, jid: str) -> tuple[str, ...]:
    return tuple(n for n, _ in core.jobs[jid].placement)


def state(core: SchedulerCore, jid: str) -> JobState | None:
    return core.jobs[jid].state


# -- loss timeout --------------------------------------------------------------------------

@pytest.mark.parametrize(("misses", "interval", "expect"), [
    (3, 5.0, 25.0),  # three 5 s heartbeats after the one at 10
    (1, 2.0, 12.0),
    (2, 0.0, 20.0),  # interval not announced: the configured default (5 s)
])
def test_each_heartbeat_moves_the_node_deadline(misses: int, interval: float,
                                                 expect: float) -> None:
    core = core_with(("a", 4), misses=misses)
    effects = deliver(core, beat("n0", "a", interval_s=interval), 10.0)
    assert timers(effects) == {lost_key("n0"): expect}
    assert published(effects, NodeCommand) == []  # it runs exactly what it owns


def test_nodes_that_never_beat_are_never_watched() -> None:
    """Simulations send no heartbeats: no deadline, no liveness effect at all."""
    core = core_with(("a", 4), ("b", 4))
    core.on_timer("cycle", 50.0)
    assert core.faults.watched == set() and core.faults.lost == set()
    assert {state(core, j) for j in "ab"} == {JobState.RUNNING}


def test_a_heartbeat_from_an_unknown_node_is_refused() -> None:
    core = core_with(("a", 1))
    with pytest.raises(ValueError, match="node 'n9', which is not in the cluster"):
        deliver(core, beat("n9"), 1.0)


# -- requeue -------------------------------------------------------------------------------

@pytest.mark.parametrize(("jobs", "lost", "requeued", "after"), [
    ((("a", 4), ("b", 4)), "n1", {"b"}, {"a"}),
    ((("a", 4), ("b", 4)), "n0", {"a"}, {"a"}),  # FIFO: the older job takes the node left
    ((("g", 8),), "n1", {"g"}, set()),  # a gang across both nodes: one lost node takes it all
])
def test_a_lost_node_requeues_its_jobs_and_is_cordoned(
        jobs: tuple[tuple[str, int], ...], lost: str, requeued: set[str], after: set[str]) -> None:
    core = core_with(*jobs)
    deliver(core, beat(lost), 10.0)
    effects = core.on_timer(lost_key(lost), 25.0)
    (plan,) = published(effects, PlanDecided)
    assert {s.job_id for s in plan.stops} == requeued
    assert all(s.reason == f"node {lost} lost" for s in plan.stops)
    moved = published(effects, JobTransition)
    assert {t.job_id for t in moved} == requeued
    assert all((t.previous, t.state, t.cause) == (JobState.RUNNING, JobState.PREEMPTED,
                                                  f"requeued: node {lost} lost") for t in moved)
    assert core.faults.lost == {lost}
    assert timers(effects)["cycle"] == 25.0  # re-plan at once
    core.on_timer("cycle", 25.0)
    running = {j for j, _ in jobs if state(core, j) is JobState.RUNNING}
    assert running == after
    assert all(lost not in node_of(core, j) for j in running)  # nothing lands on it


def test_a_requeued_job_restarts_from_the_progress_last_reported() -> None:
    core = core_with(("a", 4), ("b", 4))
    deliver(core, beat("n1", "b"), 10.0)
    deliver(core, NodeStatus(node_id="n1", cycle=1, progress={"b": 300.0}), 300.0)
    core.on_timer("cycle", 400.0)  # the estimate moves on ...
    assert core.jobs["b"].iterations_done > 300.0
    effects = core.on_timer(lost_key("n1"), 420.0)
    (t,) = published(effects, JobTransition)
    assert t.iterations_done == 300.0  # ... but the job resumes from what the node reported
    deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=1000), 1000.0)
    (launch,) = published(core.on_timer("cycle", 1000.0), PlanDecided)[0].launches
    assert (launch.job_id, launch.iterations_done, launch.placement[0][0]) == ("b", 300.0, "n0")


def test_reports_from_a_lost_node_are_ignored() -> None:
    core = core_with(("a", 4), ("b", 4))
    deliver(core, beat("n1", "b"), 10.0)
    core.on_timer(lost_key("n1"), 25.0)
    core.on_timer("cycle", 25.0)
    deliver(core, NodeStatus(node_id="n1", cycle=2, progress={"b": 999.0}), 30.0)
    assert core.jobs["b"].iterations_done < 999.0
    # "b" is requeued, not running: a late partial finish or failure changes nothing ...
    assert deliver(core, JobFinished(job_id="b", node_id="n1", iterations_done=999), 31.0) == []
    assert deliver(core, JobFinished(job_id="b", node_id="n1", iterations_done=1000,
                                     failure="crashed"), 31.0) == []
    assert state(core, "b") is JobState.PREEMPTED
    # ... but all the work done there finishes it: its agent would never start it again.
    (t,) = published(deliver(core, JobFinished(job_id="b", node_id="n1", iterations_done=1000),
                             32.0), JobTransition)
    assert (t.previous, t.state, t.cause) == (JobState.PREEMPTED, JobState.FINISHED,
                                              "completed while requeued")
    assert deliver(core, JobFinished(job_id="b", node_id="n1", iterations_done=1000), 33.0) == []


def _lost(core: SchedulerCore) -> list[Effect]:
    deliver(core, beat("n1", "b"), 10.0)
    return core.on_timer(lost_key("n1"), 25.0)


def _vanished(core: SchedulerCore) -> list[Effect]:
    deliver(core, seen("n1", (4, 1)), 10.0)
    return deliver(core, seen("n1", (4, 1)), 15.0)


def _suspended(core: SchedulerCore) -> list[Effect]:
    return deliver(core, OperatorCommand(command="suspend", job_id="b"), 10.0)


@pytest.mark.parametrize("take_off", [_lost, _vanished, _suspended])
def test_plans_outside_a_cycle_carry_the_leader_s_term(take_off: Any) -> None:
    """The placer refuses plans of an older term: a lost node's requeue used to go out with
    term 0, so after any election the placer dead-lettered it and kept the jobs bound."""
    core = core_with(("a", 4), ("b", 4))
    core.term = 4  # elected after these jobs were launched (at term 0)
    (plan,) = published(take_off(core), PlanDecided)
    assert [s.job_id for s in plan.stops] == ["b"]
    assert (plan.term, plan.cycle) == (4, core.cycle)


def test_a_finish_from_a_node_the_job_has_left() -> None:
    """Partial or failed: stale, ignored. All the work: the job is done (the placer stops the
    run it has now; found by the chaos test, where ignoring it left the job with no run)."""
    core = core_with(("a", 4), ("b", 4))
    deliver(core, beat("n1", "b"), 10.0)
    core.on_timer(lost_key("n1"), 25.0)
    deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=1000), 30.0)
    core.on_timer("cycle", 30.0)
    assert node_of(core, "b") == ("n0",)
    assert deliver(core, JobFinished(job_id="b", node_id="n1", iterations_done=999), 31.0) == []
    assert deliver(core, JobFinished(job_id="b", node_id="n1", iterations_done=1000,
                                     failure="crashed"), 31.0) == []
    assert state(core, "b") is JobState.RUNNING
    (t,) = published(deliver(core, JobFinished(job_id="b", node_id="n1", iterations_done=1000),
                             32.0), JobTransition)
    assert (t.previous, t.state, t.cause) == (JobState.RUNNING, JobState.FINISHED,
                                              "completed on n1, a node it had left")


# -- return and reconcile ------------------------------------------------------------------

def test_a_returning_node_is_told_to_stop_what_it_no_longer_owns() -> None:
    core = core_with(("a", 4), ("b", 4))
    deliver(core, beat("n1", "b"), 10.0)
    core.on_timer(lost_key("n1"), 25.0)
    deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=1000), 30.0)
    core.on_timer("cycle", 30.0)  # "b" now runs on n0
    effects = deliver(core, beat("n1", "b", "ghost"), 40.0)  # back, still running "b"
    (cmd,) = published(effects, NodeCommand)
    assert [(s.job_id, s.reason) for s in cmd.stops] == [
        ("b", "reconcile: not placed here"), ("ghost", "reconcile: not placed here")]
    assert cmd.launches == ()
    assert [e.subject for e in effects if isinstance(e, Publish)] == [subjects.node_command("n1")]
    assert core.faults.lost == set()  # schedulable again
    assert timers(effects)["cycle"] == 40.0  # a cycle to use it
    deliver(core, SubmitJob.from_spec(make_job("c").gpus(4).runs_for(10).build()), 41.0)
    core.on_timer("cycle", 41.0)
    assert node_of(core, "c") == ("n1",)


def seen(node: str, handled: tuple[int, int] | None, *jobs: str) -> NodeHeartbeat:
    return NodeHeartbeat(node_id=node, jobs=jobs, interval_s=5.0, handled=handled)


# Heartbeats from n0 after "a" (1 GPU, one 1-second iteration left of 1,000) was launched by
# the plan of cycle 1, term 0: whether its run counts as vanished, a failed attempt.
VANISH = {
    # The demo's hang: the node dropped the launch, and never ran it.
    "carried out, missing twice": ([seen("n0", (0, 1)), seen("n0", (0, 1))], True),
    "missing once: a finish may be on its way": ([seen("n0", (0, 1))], False),
    "listed in between": ([seen("n0", (0, 1)), seen("n0", (0, 1), "a"), seen("n0", (0, 1))],
                          False),
    "the launch not yet carried out": ([seen("n0", (0, 0)), seen("n0", (0, 0))], False),
    "an agent that does not say": ([seen("n0", None), seen("n0", None)], False),
    "another node's beats": ([seen("n1", (0, 1)), seen("n1", (0, 1))], False),
}


@pytest.mark.parametrize("name", list(VANISH))
def test_a_run_missing_from_the_heartbeats_of_a_node_that_launched_it(name: str) -> None:
    beats, vanished = VANISH[name]
    core = core_with(("a", 1))
    assert core.jobs["a"].launched_by == (0, 1) and node_of(core, "a") == ("n0",)
    deliver(core, NodeStatus(node_id="n0", cycle=1, progress={"a": 400.0}), 5.0)
    effects: list[Effect] = []
    for i, hb in enumerate(beats):
        effects = deliver(core, hb, 10.0 + 5 * i)
    if not vanished:
        assert state(core, "a") is JobState.RUNNING and published(effects, PlanDecided) == []
        return
    (plan,) = published(effects, PlanDecided)
    assert [(s.job_id, s.reason) for s in plan.stops] == [
        ("a", "its run vanished from node n0 (not in 2 heartbeats)")]
    (t,) = published(effects, JobTransition)
    assert (t.state, t.iterations_done) == (JobState.PREEMPTED, 400.0)  # from its last report
    assert t.cause.startswith("trainer failed on n0 (its run vanished from node n0")
    assert retry_key("a") in timers(effects)  # an attempt spent: backoff, then again


def test_a_run_taken_for_vanished_may_yet_report_all_its_work() -> None:
    """Its finish report was delayed past two heartbeats (a stalled consumer): the job is done,
    its retry called off; a partial report changes nothing."""
    core = core_with(("a", 1))
    for at in (10.0, 15.0):
        deliver(core, seen("n0", (0, 1)), at)
    assert core.faults.backoff and state(core, "a") is JobState.PREEMPTED
    assert deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=999), 16.0) == []
    (t,) = published(deliver(core, JobFinished(job_id="a", node_id="n0",
                                               iterations_done=1000), 17.0), JobTransition)
    assert (t.state, t.cause) == (JobState.FINISHED, "completed while requeued")
    assert core.faults.backoff == {}
    assert core.on_timer(retry_key("a"), 60.0) == []  # no second life


def test_a_restarted_agent_loses_what_its_predecessor_ran() -> None:
    core = core_with(("a", 4), ("b", 4))
    effects = deliver(core, NodeInfo(node_id="n1", backend="fake", gpus=()), 12.0)
    (t,) = published(effects, JobTransition)
    assert (t.job_id, t.cause) == ("b", "requeued: node n1 restarted")
    assert core.faults.lost == set()  # restarted, not lost: it can take work at once
    core.on_timer("cycle", 12.0)
    assert node_of(core, "b") == ("n1",)


# -- launch confirmation ---------------------------------------------------------------------

def watched_core(timeout: float = 60.0) -> SchedulerCore:
    """Two nodes that have sent heartbeats; "a" (4 GPUs) then submitted and launched at 10 on
    n0 by the plan of cycle 1."""
    cfg = SchedulerConfig(liveness=LivenessConfig(launch_timeout_s=timeout))
    core = SchedulerCore(cluster(2, 4), policies.make("fifo"), cfg)
    for node in ("n0", "n1"):
        deliver(core, beat(node), 1.0)
    deliver(core, SubmitJob.from_spec(make_job("a").gpus(4).runs_for(1000).build()), 10.0)
    return core


# What n0 says between the launch at 10 and the deadline at 70: whether the run counts as
# never started when the deadline comes.
START = {
    "nothing at all (a dropped command)": ([], True),
    "heartbeats that do not list it": ([beat("n0"), beat("n0")], True),
    "another node lists it": ([beat("n1", "a")], True),
    "a heartbeat lists it": ([beat("n0", "a")], False),
    "a progress report": ([NodeStatus(node_id="n0", cycle=1, progress={"a": 3.0})], False),
}


@pytest.mark.parametrize("name", list(START))
def test_a_launch_its_node_never_shows_started_frees_its_gpus_at_the_deadline(
        name: str) -> None:
    said, never_started = START[name]
    core = watched_core(timeout=60.0)
    effects = core.on_timer("cycle", 10.0)
    key = launch_key("a", (0, 1))
    assert timers(effects)[key] == 70.0 and node_of(core, "a") == ("n0",)
    for i, body in enumerate(said):
        deliver(core, body, 20.0 + i)
    effects = core.on_timer(key, 70.0)
    if not never_started:
        assert effects == [] and state(core, "a") is JobState.RUNNING
        return
    (plan,) = published(effects, PlanDecided)
    assert [(s.job_id, s.reason) for s in plan.stops] == [
        ("a", "not started on node n0 within 60 s")]
    (t,) = published(effects, JobTransition)
    assert t.state is JobState.PREEMPTED
    assert t.cause.startswith("trainer failed on n0 (not started on node n0 within 60 s)")
    assert "a" not in core.jobs.running  # its GPUs are free for the next cycle
    assert core.status("a").decided_by == "retry"


def test_a_launch_deadline_is_for_that_run_only() -> None:
    """The job moved (a later plan): the first run's deadline passes without effect."""
    core = watched_core()
    core.on_timer("cycle", 10.0)
    core.jobs["a"].launched_by = (0, 2)  # as a later cycle's migration would set it
    assert core.on_timer(launch_key("a", (0, 1)), 70.0) == []


@pytest.mark.parametrize(("timeout", "beats"), [(0.0, True), (60.0, False)])
def test_no_launch_deadline_when_off_or_in_simulation(timeout: float, beats: bool) -> None:
    cfg = SchedulerConfig(liveness=LivenessConfig(launch_timeout_s=timeout))
    core = SchedulerCore(cluster(2, 4), policies.make("fifo"), cfg)
    if beats:
        deliver(core, beat("n0"), 1.0)
    deliver(core, SubmitJob.from_spec(make_job("a").gpus(4).runs_for(1000).build()), 10.0)
    effects = core.on_timer("cycle", 10.0)
    assert not [k for k in timers(effects) if isinstance(k, tuple) and k[0] == "launch"]


def test_a_launch_refused_for_good_fails_the_job_at_once() -> None:
    core = core_with(("a", 4), ("b", 4), retry=RetryPolicy(max_attempts=3))
    why = "launch refused on n0: no trainer workload for model 'xgboost'"
    effects = deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=0.0,
                                        failure=why, permanent=True), 5.0)
    (t,) = published(effects, JobTransition)
    assert (t.state, t.cause) == (JobState.FAILED, f"failed: {why}")
    assert retry_key("a") not in timers(effects)
    assert core.status("a").reason == f"{why} (not retried)"
    deliver(core, SubmitJob.from_spec(make_job("c").gpus(4).runs_for(10).build()), 6.0)
    core.on_timer("cycle", 6.0)
    assert state(core, "c") is JobState.RUNNING  # "a"'s GPUs went to the next job


def test_a_bad_launch_timeout_is_named() -> None:
    with pytest.raises(ValueError, match="launch timeout must be >= 0 s"):
        LivenessConfig(launch_timeout_s=-1.0)


# -- retries -------------------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "delays"), [
    (RetryPolicy(max_attempts=5, base_s=10, factor=2, cap_s=300), [10, 20, 40, 80]),
    (RetryPolicy(max_attempts=5, base_s=10, factor=3, cap_s=50), [10, 30, 50, 50]),
    (RetryPolicy(max_attempts=3, base_s=0, factor=1, cap_s=0), [0, 0]),
])
def test_backoff_schedule(policy: RetryPolicy, delays: list[float]) -> None:
    assert [policy.delay("j", n) for n in range(1, policy.max_attempts)] == delays


def test_jitter_is_seeded_bounded_and_differs_by_job() -> None:
    p = RetryPolicy(base_s=100, cap_s=100, jitter=0.2, seed=7)
    draws = [p.delay(f"j{i}", 1) for i in range(50)]
    assert all(80 <= d <= 120 for d in draws) and len(set(draws)) == 50
    assert draws == [RetryPolicy(base_s=100, cap_s=100, jitter=0.2, seed=7).delay(f"j{i}", 1)
                     for i in range(50)]
    assert draws != [RetryPolicy(base_s=100, cap_s=100, jitter=0.2, seed=8).delay(f"j{i}", 1)
                     for i in range(50)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_attempts": 0}, "max_attempts must be >= 1"),
    ({"factor": 0.5}, "factor >= 1"),
    ({"base_s": 10, "cap_s": 5}, "cap_s >= base_s"),
    ({"jitter": 1.0}, r"jitter must be in \[0, 1\)"),
])
def test_bad_retry_settings_are_named(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def fail(core: SchedulerCore, jid: str, now: float, done: float = 0.0) -> list[Effect]:
    node = core.jobs[jid].placement[0][0]
    return deliver(core, JobFinished(job_id=jid, node_id=node, iterations_done=done,
                                     failure="rank 0 exited with 1"), now)


def test_a_failed_trainer_is_retried_with_backoff_then_the_job_fails() -> None:
    core = core_with(("a", 4), retry=RetryPolicy(max_attempts=3, base_s=10, factor=2))
    seen: list[tuple[JobState, str]] = []
    now = 0.0
    for attempt, delay in ((1, 10.0), (2, 20.0)):
        now += 5
        effects = fail(core, "a", now, done=50.0 * attempt)
        (t,) = published(effects, JobTransition)
        seen.append((t.state, t.cause))
        assert timers(effects)[retry_key("a")] == now + delay
        core.on_timer("cycle", now)
        assert state(core, "a") is JobState.PREEMPTED  # out of the policy's sight meanwhile
        assert core.status("a").decided_by == "retry"
        now += delay
        core.on_timer(retry_key("a"), now)
        (launch,) = published(core.on_timer("cycle", now), PlanDecided)[0].launches
        assert launch.iterations_done == 50.0 * attempt  # from where its trainer got to
    effects = fail(core, "a", now + 5)
    (t,) = published(effects, JobTransition)
    seen.append((t.state, t.cause))
    assert retry_key("a") not in timers(effects)
    assert seen == [
        (JobState.PREEMPTED, "trainer failed on n0 (rank 0 exited with 1); retry 1 of 2 at 15"),
        (JobState.PREEMPTED, "trainer failed on n0 (rank 0 exited with 1); retry 2 of 2 at 40"),
        (JobState.FAILED, "failed: rank 0 exited with 1"),
    ]
    status = core.status("a")
    assert status.code is StatusCode.FAILED
    assert status.reason == "trainer failed 3 time(s), last on n0: rank 0 exited with 1"
    assert t.status == status


def test_a_failure_frees_the_gpus_for_the_next_job_during_backoff() -> None:
    core = core_with(("a", 8), ("b", 8))
    fail(core, "a", 5.0)
    core.on_timer("cycle", 5.0)
    assert state(core, "b") is JobState.RUNNING


def test_cancel_during_backoff_ends_the_job_and_its_retry() -> None:
    core = core_with(("a", 4))
    fail(core, "a", 5.0)
    effects = deliver(core, OperatorCommand(command="cancel", job_id="a"), 6.0)
    assert CancelTimer(retry_key("a")) in effects
    assert state(core, "a") is JobState.FAILED
    assert core.on_timer(retry_key("a"), 15.0) == []  # a stale timer does nothing


# -- metrics -------------------------------------------------------------------------------

def test_metrics_count_each_kind_of_fault() -> None:
    core = core_with(retry=RetryPolicy(max_attempts=2, base_s=1))
    out: list[Effect] = []
    for jid in "ab":
        spec = make_job(jid).gpus(4).runs_for(1000).build()
        out += deliver(core, SubmitJob.from_spec(spec), 0.0)
    out += core.on_timer("cycle", 0.0)
    deliver(core, beat("n1", "b"), 10.0)
    out += core.on_timer(lost_key("n1"), 25.0)  # b requeued: node lost
    out += fail(core, "a", 26.0)  # a: retry 1 of 1
    out += core.on_timer(retry_key("a"), 27.0)
    out += core.on_timer("cycle", 27.0)
    out += deliver(core, NodeInfo(node_id=node_of(core, "a")[0], backend="fake", gpus=()), 28.0)
    metrics = MetricsCore(core.cluster.total_gpus)
    for t in published(out, JobTransition):
        metrics.handle(envelope(t, event_id=f"m{id(t)}", occurred_at=0.0, producer="s",
                                causation_id=None), 0.0)
    assert dict(metrics.faults) == {"node-lost": 1, "trainer-failed": 1, "node-restarted": 1}
    scrape = exposition(registry_for(metrics, core.cluster))
    assert 'loom_job_faults_total{kind="node-lost"} 1.0' in scrape
    assert 'loom_job_faults_total{kind="trainer-failed"} 1.0' in scrape


@pytest.mark.parametrize(("cause", "kind"), [
    ("requeued: node n1 lost", "node-lost"),
    ("requeued: node n1 restarted", "node-restarted"),
    ("trainer failed on n0 (exit 1); retry 1 of 2 at 30", "trainer-failed"),
    ("failed: exit 1", "trainer-failed"),
    ("failed: launch refused on n0: unknown model 'x'", "launch-refused"),
    (f"trainer failed on n0 ({launch_timeout_failure('n0', 120)}); retry 1 of 2 at 9",
     "launch-timeout"),
    (f"failed: {launch_timeout_failure('n0', 5)}", "launch-timeout"),
    ("completed", None), ("suspended", None),
])
def test_a_version_1_cause_is_read_as_its_fault(cause: str, kind: str | None) -> None:
    state = JobState.PREEMPTED if cause.startswith(("requeued", "trainer")) else JobState.FAILED
    assert Cause.from_v1(cause, state).fault == kind


@pytest.mark.parametrize("name", ["fifo", "srtf", "tiresias", "muri-s", "edf", "elasticflow"])
def test_every_kind_of_policy_runs_a_requeued_job_again(name: str) -> None:
    """The policy hears of the requeue (`job_requeued`) and keeps the job in its sight."""
    policy = policies.make(name)
    policy.configure(seed=0, round_s=60.0, profile=None)
    replan = "slot" if policy.replan == "slot" else "event"
    core = SchedulerCore(cluster(2, 4), policy, SchedulerConfig(replan=replan, round_s=60.0))
    for jid, deadline in (("a", 5000.0), ("b", 6000.0)):
        spec = make_job(jid).gpus(4).runs_for(1000).deadline(deadline).build()
        deliver(core, SubmitJob.from_spec(spec), 0.0)
    core.on_timer("cycle", 0.0)
    victim = next(j for j in "ab" if node_of(core, j) == ("n1",))
    deliver(core, beat("n1"), 1.0)
    core.on_timer(lost_key("n1"), 20.0)
    core.on_timer("cycle", 60.0)
    (other,) = set("ab") - {victim}
    assert state(core, victim) is JobState.PREEMPTED and state(core, other) is JobState.RUNNING
    deliver(core, JobFinished(job_id=other, node_id="n0", iterations_done=1000), 1100.0)
    core.on_timer("cycle", 1100.0)
    assert state(core, victim) is JobState.RUNNING and node_of(core, victim) == ("n0",)
