"""Operators' commands to the scheduler core: cancel, suspend/resume, drain, set-policy."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import policies
from schemas.events import JobTransition, OperatorCommand, PlanDecided, SubmitJob, envelope
from schemas.job import JobState
from schemas.status import StatusCode
from services.runtime.effects import Effect, Publish
from services.scheduler.core import SchedulerConfig, SchedulerCore
from tests.builders import cluster, make_job

_n = 0


def deliver(core: SchedulerCore, body: object, now: float) -> list[Effect]:
    global _n
    _n += 1
    env = envelope(body, event_id=f"o{_n}", occurred_at=now, producer="t",  # type: ignore[arg-type]
                   causation_id=None)
    return core.handle(env, now)


def published(effects: list[Effect], kind: type) -> list:  # type: ignore[type-arg]
    return [e.body for e in effects if isinstance(e, Publish) and isinstance(e.body, kind)]


def core_with(policy: str, *jobs: tuple[str, int, int], nodes: int = 1) -> SchedulerCore:
    """A core on `nodes` × 4 GPUs with jobs (id, GPUs, seconds) admitted and one cycle run."""
    core = SchedulerCore(cluster(nodes, 4), policies.make(policy), SchedulerConfig())
    for jid, gpus, seconds in jobs:
        deliver(core, SubmitJob.from_spec(make_job(jid).gpus(gpus).runs_for(seconds).build()),
                0.0)
    core.on_timer("cycle", 0.0)
    return core


def op(command: str, **target: str) -> OperatorCommand:
    return OperatorCommand(command=command, **target)  # type: ignore[arg-type]


def running(core: SchedulerCore) -> set[str]:
    return {jid for jid, r in core.jobs.items() if r.state is JobState.RUNNING}


def test_cancel_a_running_job_stops_it_and_gives_its_gpus_to_the_next() -> None:
    core = core_with("fifo", ("a", 4, 100), ("b", 4, 100))
    effects = deliver(core, op("cancel", job_id="a"), 10.0)
    (stop,) = published(effects, PlanDecided)
    assert [s.job_id for s in stop.stops] == ["a"]
    (t,) = published(effects, JobTransition)
    assert (t.state, t.previous, t.cause) == (JobState.FAILED, JobState.RUNNING, "cancelled")
    assert core.status("a").code is StatusCode.CANCELLED
    assert "cancelled by operator" in core.status("a").reason
    core.on_timer("cycle", 10.0)
    assert running(core) == {"b"}


def test_cancel_a_waiting_job() -> None:
    core = core_with("fifo", ("a", 4, 100), ("b", 4, 100))
    effects = deliver(core, op("cancel", job_id="b"), 5.0)
    assert published(effects, PlanDecided) == []
    assert core.jobs["b"].state is JobState.FAILED
    assert "b" not in core.views


def test_suspend_holds_a_job_out_of_the_policy_until_resumed() -> None:
    core = core_with("fifo", ("a", 4, 100), ("b", 4, 100))
    effects = deliver(core, op("suspend", job_id="a"), 10.0)
    (t,) = published(effects, JobTransition)
    assert (t.state, t.cause) == (JobState.PREEMPTED, "suspended")
    assert core.status("a").code is StatusCode.SUSPENDED
    core.on_timer("cycle", 10.0)
    assert running(core) == {"b"}  # a, though first in FIFO order, stays out
    assert deliver(core, op("suspend", job_id="a"), 11.0) == []  # idempotent
    deliver(core, op("resume", job_id="a"), 20.0)
    assert core.status("a").code is not StatusCode.SUSPENDED
    assert "a" in core.views
    assert deliver(core, op("resume", job_id="a"), 21.0) == []  # idempotent


def test_a_suspended_job_keeps_its_progress() -> None:
    core = core_with("fifo", ("a", 4, 100))
    deliver(core, op("suspend", job_id="a"), 40.0)
    deliver(core, op("resume", job_id="a"), 50.0)
    core.on_timer("cycle", 50.0)
    assert core.jobs["a"].iterations_done == pytest.approx(40.0)
    assert running(core) == {"a"}


def test_drain_keeps_running_jobs_but_places_nothing_new_there() -> None:
    core = core_with("fifo", ("a", 2, 100), nodes=2)
    (a_node,) = {node for node, _ in core.jobs["a"].placement}
    other = next(n.node_id for n in core.cluster.nodes if n.node_id != a_node)
    deliver(core, op("drain", node_id=a_node), 1.0)
    deliver(core, op("drain", node_id=other), 1.0)
    deliver(core, SubmitJob.from_spec(make_job("b").gpus(1).runs_for(10).build()), 2.0)
    core.on_timer("cycle", 2.0)
    assert running(core) == {"a"}  # a goes on where it is; b finds no undrained node
    deliver(core, op("undrain", node_id=other), 3.0)
    core.on_timer("cycle", 3.0)
    assert running(core) == {"a", "b"}
    assert {node for node, _ in core.jobs["b"].placement} == {other}


def test_set_policy_takes_over_every_active_job() -> None:
    core = core_with("fifo", ("long", 4, 1000), ("short", 4, 10), ("mid", 4, 100))
    assert running(core) == {"long"}
    deliver(core, op("set-policy", policy="srtf"), 5.0)
    assert core.policy.name == "srtf"
    core.on_timer("cycle", 5.0)
    assert running(core) == {"short"}  # SRTF preempts the long job for the shortest


@pytest.mark.parametrize("policy", ["srtf", "tiresias", "fifo"])
def test_set_policy_leaves_a_running_job_where_it_is(policy: str) -> None:
    """The new policy is told which jobs already run: it walks each once, rather than also
    as a waiting job that it then places a second time, on other GPUs."""
    core = core_with("srsf", ("a", 2, 100))
    before = core.jobs["a"].placement
    deliver(core, op("set-policy", policy=policy), 5.0)
    effects = core.on_timer("cycle", 5.0)
    assert core.jobs["a"].placement == before
    assert not [p for p in published(effects, PlanDecided) if p.launches or p.stops]


@pytest.mark.parametrize(("command", "match"), [
    (op("cancel", job_id="ghost"), "cancel: no active job 'ghost'"),
    (op("drain", node_id="n99"), "drain: no node 'n99' in the cluster"),
    (op("set-policy", policy="nope"), "unknown policy 'nope'"),
])
def test_commands_that_cannot_apply_raise_with_the_reason(command: OperatorCommand,
                                                           match: str) -> None:
    core = core_with("fifo", ("a", 4, 100))
    with pytest.raises((ValueError, KeyError), match=match):
        deliver(core, command, 1.0)


@pytest.mark.parametrize(("command", "field"), [
    ("cancel", "job_id"), ("suspend", "job_id"), ("drain", "node_id"),
    ("set-policy", "policy")])
def test_a_command_without_its_target_is_invalid(command: str, field: str) -> None:
    with pytest.raises(ValidationError, match=f"{command} needs {field}"):
        OperatorCommand(command=command)  # type: ignore[arg-type]
