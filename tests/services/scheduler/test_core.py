"""The scheduler core driven directly: inputs in, effects out, no bus."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import pytest

import policies
from schemas import subjects
from schemas.events import (
    CycleStarted,
    GpuInfo,
    GpuLink,
    JobFinished,
    JobTransition,
    NodeInfo,
    NodeStatus,
    PlanDecided,
    envelope,
)
from schemas.job import JobState, SubmitJob
from schemas.status import StatusCode
from services.runtime.effects import CancelTimer, Effect, Publish, SetTimer
from services.scheduler.core import SchedulerConfig, SchedulerCore
from tests.builders import cluster, make_job

_n = 0


def _deliver(core: SchedulerCore, body, now: float) -> list[Effect]:  # type: ignore[no-untyped-def]
    global _n
    _n += 1
    env = envelope(body, event_id=f"e{_n}", occurred_at=now, producer="t", causation_id=None)
    return core.handle(env, now)


def _published(effects: list[Effect], kind: type) -> list:  # type: ignore[type-arg]
    return [e.body for e in effects if isinstance(e, Publish) and isinstance(e.body, kind)]


def _timers(effects: list[Effect]) -> dict[Hashable, float]:
    return {e.key: e.at for e in effects if isinstance(e, SetTimer)}


def _core(policy: str = "srtf", replan: str = "event", nodes: int = 1, gpus: int = 4
          ) -> SchedulerCore:
    return SchedulerCore(cluster(nodes, gpus), policies.make(policy),
                         SchedulerConfig(replan=replan))  # type: ignore[arg-type]


def _submit(core: SchedulerCore, spec, now: float) -> list[Effect]:  # type: ignore[no-untyped-def]
    return _deliver(core, SubmitJob.from_spec(spec), now)


def test_admission_queues_the_job_and_asks_for_one_cycle_per_instant() -> None:
    core = _core()
    eff = _submit(core, make_job("a").gpus(2).build(), 0.0)
    (t,) = _published(eff, JobTransition)
    assert (t.state, t.previous, t.spec.job_id) == (JobState.QUEUED, None, "a")
    assert _timers(eff) == {"cycle": 0.0}
    eff2 = _submit(core, make_job("b").build(), 0.0)
    assert "cycle" not in _timers(eff2)  # one cycle serves every input at this instant


def test_a_cycle_starts_plans_and_records_every_transition() -> None:
    core = _core()
    _submit(core, make_job("a").gpus(2).runs_for(100).build(), 0.0)
    _submit(core, make_job("b").gpus(4).runs_for(50).build(), 0.0)
    eff = core.on_timer("cycle", 0.0)
    (plan,) = _published(eff, PlanDecided)
    assert [launch.job_id for launch in plan.launches] == ["b"]  # shorter first; a cannot fit
    assert plan.busy_gpus == 4 and plan.running == 1
    assert core.jobs["b"].last is not None and core.jobs["b"].last.state is JobState.RUNNING
    st = core.status("a")
    assert st.code in (StatusCode.WAITING_FOR_PRIORITY, StatusCode.WAITING_FOR_GPUS)
    assert st.queue_position == 1 and st.reason


def test_shorter_arrival_preempts_and_the_cycle_is_announced_to_nodes() -> None:
    core = _core()
    _submit(core, make_job("long").gpus(4).runs_for(1000).build(), 0.0)
    core.on_timer("cycle", 0.0)
    _submit(core, make_job("short").gpus(4).runs_for(10).submit(100).build(), 100.0)
    eff = core.on_timer("cycle", 100.0)
    assert _published(eff, CycleStarted)[0].cycle == 2
    (plan,) = _published(eff, PlanDecided)
    assert [s.job_id for s in plan.stops] == ["long"]
    assert [launch.job_id for launch in plan.launches] == ["short"]
    states = {t.job_id: t.state for t in _published(eff, JobTransition)}
    assert states == {"long": JobState.PREEMPTED, "short": JobState.RUNNING}
    # The preempted job's progress is estimated (100 of 1000 iterations) for its resume.
    assert core.jobs["long"].iterations_done == 100.0
    assert core.jobs["long"].preemptions == 1


def test_node_reports_override_the_estimate() -> None:
    core = _core()
    _submit(core, make_job("a").gpus(4).runs_for(1000).build(), 0.0)
    core.on_timer("cycle", 0.0)
    _deliver(core, NodeStatus(node_id="n0", cycle=1, progress={"a": 42.0}), 50.0)
    assert core.jobs["a"].iterations_done == 42.0


def test_completion_frees_gpus_and_triggers_a_cycle() -> None:
    core = _core()
    _submit(core, make_job("a").gpus(4).runs_for(10).build(), 0.0)
    _submit(core, make_job("b").gpus(4).runs_for(20).build(), 0.0)
    core.on_timer("cycle", 0.0)
    eff = _deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=10), 10.0)
    assert _published(eff, JobTransition)[0].state is JobState.FINISHED
    assert _timers(eff) == {"cycle": 10.0}
    eff = core.on_timer("cycle", 10.0)
    assert [launch.job_id for launch in _published(eff, PlanDecided)[0].launches] == ["b"]
    assert core.status("a").code is StatusCode.FINISHED
    # A duplicate or stale finish report changes nothing.
    assert _deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=10), 11.0) == []


def test_duplicate_submission_is_ignored() -> None:
    core = _core()
    spec = make_job("a").build()
    assert _submit(core, spec, 0.0)
    assert _submit(core, spec, 1.0) == []
    assert len(core.jobs) == 1


def test_the_same_job_resubmitted_without_a_time_is_taken_once() -> None:
    """`loom submit` retried: the body has no submit time; the scheduler stamped the first."""
    core = _core()
    body = SubmitJob.model_validate({"job_id": "a", "model": "bert", "gpus": 1,
                                     "iterations": 10, "iteration_time_s": 1.0})
    assert _deliver(core, body, 0.0)
    assert _deliver(core, body, 5.0) == []
    assert core.jobs["a"].spec.submit_time_s == 0.0


def test_another_job_under_a_taken_id_is_refused_with_the_reason() -> None:
    """Raised, so the shell dead-letters it with the reason; the first job is untouched."""
    core = _core()
    first = make_job("a").gpus(1).build()
    _submit(core, first, 0.0)
    with pytest.raises(ValueError, match="duplicate job id 'a': a different job"):
        _submit(core, make_job("a").gpus(2).build(), 1.0)
    assert core.jobs["a"].spec == first


@pytest.mark.parametrize(("gpus", "taken"), [(2, True), (4, False)])
def test_a_finished_job_s_id_is_still_taken_once_its_record_is_packed(gpus: int, taken: bool
                                                                      ) -> None:
    """The cycle after a job ends packs its record; a resubmission is still compared with it:
    the same job again is a no-op, another one under its id is refused."""
    core = _core()
    spec = make_job("a").gpus(2).runs_for(10).build()
    _submit(core, spec, 0.0)
    core.on_timer("cycle", 0.0)
    _deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=10), 10.0)
    core.on_timer("cycle", 10.0)  # packs it
    again = make_job("a").gpus(gpus).runs_for(10).build()
    if taken:
        assert _submit(core, again, 20.0) == []
    else:
        with pytest.raises(ValueError, match="duplicate job id 'a': a different job"):
            _submit(core, again, 20.0)
    assert core.jobs["a"].spec == spec
    assert core.status("a").code is StatusCode.FINISHED


def test_too_large_and_invalid_jobs_are_rejected_with_a_reason() -> None:
    core = _core(nodes=1, gpus=4)
    (t,) = _published(_submit(core, make_job("big").gpus(8).build(), 0.0), JobTransition)
    assert t.state is JobState.REJECTED and "needs 8 GPUs; the cluster has 4" in t.cause
    assert core.status("big").code is StatusCode.REJECTED_TOO_LARGE
    bad = SubmitJob(job_id="odd", model="m", gpus=1, iterations=1, iteration_time_s=1.0,
                    gpu_type="tpu")
    (t2,) = _published(_deliver(core, bad, 0.0), JobTransition)
    assert t2.state is JobState.REJECTED and "tpu" in t2.cause


def test_unnamed_submission_gets_an_id_from_its_event() -> None:
    core = _core()
    sub = SubmitJob(model="m", gpus=1, iterations=1, iteration_time_s=1.0)
    (t,) = _published(_deliver(core, sub, 5.0), JobTransition)
    assert t.job_id.startswith("job-e") and t.spec is not None and t.spec.submit_time_s == 5.0


@pytest.mark.parametrize(("event_id", "job_id"), [
    ("e7", "job-e7"),
    ("has space", "job-" + hashlib.sha256(b"has space").hexdigest()[:24]),
    ("a/b", "job-" + hashlib.sha256(b"a/b").hexdigest()[:24]),
    ("x" * 200, "job-" + hashlib.sha256(b"x" * 200).hexdigest()[:24]),
])
def test_an_unnamed_job_is_taken_whatever_its_message_id(event_id: str, job_id: str) -> None:
    """The sender picks the message id (`nats pub` sets any): one that cannot name a job is
    hashed into one that can, so the job is queued rather than lost."""
    core = _core()
    sub = SubmitJob(model="m", gpus=1, iterations=1, iteration_time_s=1.0)
    env = envelope(sub, event_id=event_id, occurred_at=0.0, producer="t", causation_id=None)
    (t,) = _published(core.handle(env, 0.0), JobTransition)
    assert (t.job_id, t.state) == (job_id, JobState.QUEUED)


def test_a_job_that_cannot_be_a_spec_is_rejected_in_loom_s_words() -> None:
    """A submission built in-process without validation: refused with the field, what it got
    and what is allowed, not pydantic's text."""
    core = _core()
    sub = SubmitJob.model_construct(job_id="z", model="m", gpus=0, iterations=1,
                                    iteration_time_s=1.0)
    (t,) = _published(_deliver(core, sub, 0.0), JobTransition)
    assert t.state is JobState.REJECTED and t.status is not None
    assert t.status.code is StatusCode.REJECTED_INVALID
    assert t.cause.startswith("gpus: got 0") and "allowed:" in t.cause
    assert "pydantic" not in t.cause and "should be" not in t.cause


def test_round_mode_replans_on_the_round_grid_only() -> None:
    core = _core(replan="round")
    core = SchedulerCore(cluster(1, 4), policies.make("srtf"),
                         SchedulerConfig(replan="round", round_s=360.0))
    eff = _submit(core, make_job("a").runs_for(1000).submit(100).build(), 100.0)
    assert _timers(eff) == {"tick": 360.0}
    assert "tick" not in _timers(_submit(core, make_job("b").submit(200).build(), 200.0))
    eff = core.on_timer("tick", 360.0)
    assert _timers(eff)["tick"] == 720.0
    eff = _deliver(core, JobFinished(job_id="b", node_id="n0", iterations_done=100), 460.0)
    assert "cycle" not in _timers(eff) and "tick" not in _timers(eff)


def test_tiresias_wakeup_is_armed_and_cleared() -> None:
    core = _core(policy="tiresias")
    _submit(core, make_job("a").gpus(4).runs_for(100_000).build(), 0.0)
    eff = core.on_timer("cycle", 0.0)
    assert _timers(eff)["wakeup"] == 813.0  # ceil(3250 / 4) s of attained GPU time
    eff = _deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=1), 10.0)
    eff = core.on_timer("cycle", 10.0)
    assert any(isinstance(e, CancelTimer) and e.key == "wakeup" for e in eff)


def test_subscriptions_cover_what_the_scheduler_consumes() -> None:
    subs = {s.subject for s in _core().subscriptions()}
    assert subs == {subjects.JOB_SUBMIT, subjects.JOB_FINISHED, subjects.NODE_STATUS,
                    subjects.OPERATOR, subjects.NODE_INFO, subjects.NODE_HEARTBEAT}


def test_policies_see_running_jobs_in_admission_order_not_start_order() -> None:
    """Tiresias demotes simultaneous crossers in this order (as the Muri simulator does)."""
    core = _core(nodes=2, gpus=4)
    seen: list[list[str]] = []
    plan = core.policy.plan

    def spy(snap, fit):  # type: ignore[no-untyped-def]
        seen.append([v.job_id for v in snap.running])
        return plan(snap, fit)

    core.policy.plan = spy  # type: ignore[method-assign]
    _submit(core, make_job("a").gpus(4).runs_for(1000).build(), 0.0)
    _submit(core, make_job("x").gpus(4).runs_for(20).build(), 0.0)
    eff = core.on_timer("cycle", 0.0)  # SRTF starts x (shorter) before a
    assert [launch.job_id for launch in _published(eff, PlanDecided)[0].launches] == ["x", "a"]
    core.on_timer("cycle", 5.0)
    assert seen[-1] == ["a", "x"]


def test_a_nodes_reported_nvlink_pairs_guide_where_a_gang_goes_on_it() -> None:
    core = SchedulerCore(cluster(1, 8), policies.make("fifo"), SchedulerConfig())
    node = core.cluster.nodes[0].node_id
    uuids = [f"GPU-{i}" for i in range(8)]
    info = NodeInfo(node_id=node, backend="nvml",
                    gpus=tuple(GpuInfo(index=i, uuid=u, name="A100", memory_bytes=1)
                               for i, u in enumerate(uuids)),
                    links=(GpuLink(a="GPU-0", b="GPU-5", kind="nvlink"),
                           GpuLink(a="GPU-0", b="GPU-1", kind="pcie-host")))
    assert _deliver(core, info, 0.0) == []
    _submit(core, make_job("a").gpus(2).build(), 0.0)
    (plan,) = _published(core.on_timer("cycle", 0.0), PlanDecided)
    assert plan.launches[0].placement == ((node, (0, 5)),)


def test_a_job_given_other_gpus_of_its_node_keeps_its_own_and_does_not_restart() -> None:
    core = _core(nodes=1, gpus=8)
    _submit(core, make_job("a").gpus(2).runs_for(1000).build(), 0.0)
    _submit(core, make_job("b").gpus(4).runs_for(900).build(), 0.0)
    core.on_timer("cycle", 0.0)
    b_gpus = core.jobs["b"].placement
    # A shorter 4-GPU job needs b's node: the walk places it first, on some of b's GPUs, then
    # b on others of the same node, and a (the longest) no longer fits.
    _submit(core, make_job("c").gpus(4).runs_for(50).submit(10).build(), 10.0)
    (plan,) = _published(core.on_timer("cycle", 10.0), PlanDecided)
    assert [(s.job_id, s.reason) for s in plan.stops] == [("a", "preempted")]
    (launch,) = plan.launches
    assert launch.job_id == "c"
    assert core.jobs["b"].placement == b_gpus and core.jobs["b"].preemptions == 0
    assert not set(launch.placement[0][1]) & set(b_gpus[0][1])
