"""A node speaks only for itself: reports about a job from a node it was never placed on are
refused (raised, so the shell dead-letters them with the reason) by the scheduler and the
placer, and a report whose body names another node than its subject is refused on the wire
(`check_origin`). Before, node n1 could finish node n0's job by naming it."""

from __future__ import annotations

import pytest

import policies
from schemas import subjects
from schemas.codec import CodecError, check_origin
from schemas.events import (
    JobFinished,
    Launch,
    NodeHeartbeat,
    NodeStatus,
    OperatorCommand,
    PlanDecided,
    Stop,
    envelope,
)
from schemas.job import JobState, SubmitJob
from services.placer.core import PlacerCore
from services.runtime.effects import Publish
from services.scheduler.core import SchedulerConfig, SchedulerCore
from tests.builders import cluster, make_job

ITERATIONS = 100


def env(body: object, event_id: str = "e", producer: str = "t") -> object:
    return envelope(body, event_id=event_id, occurred_at=0.0, producer=producer,  # type: ignore[arg-type]
                    causation_id=None)


def running_on_n0() -> SchedulerCore:
    """Job `a` runs on n0 of a two-node cluster (one GPU per node)."""
    core = SchedulerCore(cluster(2, 1), policies.make("fifo"), SchedulerConfig())
    core.handle(env(SubmitJob.from_spec(make_job("a").runs_for(ITERATIONS).build()), "s"),  # type: ignore[arg-type]
                0.0)
    core.on_timer("cycle", 0.0)
    assert core.jobs["a"].placement == (("n0", (0,)),)
    return core


def finished(node: str, done: float = ITERATIONS, failure: str | None = None) -> JobFinished:
    return JobFinished(job_id="a", node_id=node, iterations_done=done, failure=failure)


@pytest.mark.parametrize(("report", "error"), [
    (finished("n1"), r"node n1 reports on job 'a', which was never placed there \(placed on: n0\)"),
    (finished("n1", 3.0, "oom"), "never placed there"),
    (JobFinished(job_id="ghost", node_id="n0", iterations_done=1.0),
     "node n0 reports on job 'ghost', which the scheduler does not know"),
    (NodeStatus(node_id="n1", cycle=1, progress={"a": 99.0}), "never placed there"),
], ids=["all-work-from-another-node", "failure-from-another-node", "unknown-job",
        "progress-from-another-node"])
def test_the_scheduler_refuses_a_report_from_a_node_the_job_never_ran_on(
        report: object, error: str) -> None:
    core = running_on_n0()
    with pytest.raises(ValueError, match=error):
        core.handle(env(report), 1.0)  # type: ignore[arg-type]
    rec = core.jobs["a"]
    assert rec.state is JobState.RUNNING and rec.reported == 0.0  # nothing of it was taken


def test_the_placed_node_is_believed_and_so_is_a_node_the_job_has_left() -> None:
    core = running_on_n0()
    core.handle(env(NodeStatus(node_id="n0", cycle=1, progress={"a": 40.0})), 1.0)  # type: ignore[arg-type]
    assert core.jobs["a"].reported == 40.0
    # Suspended (off n0) and resumed: n0 is still a node the job ran on, so its late
    # report of all the work finishes the job; n1 has never had it.
    core.handle(env(OperatorCommand(command="suspend", job_id="a"), "op1"), 2.0)  # type: ignore[arg-type]
    assert core.jobs["a"].state is JobState.PREEMPTED
    effects = core.handle(env(finished("n0"), "f"), 3.0)  # type: ignore[arg-type]
    assert core.jobs["a"].state is JobState.FINISHED
    assert any(isinstance(e, Publish) for e in effects)
    with pytest.raises(ValueError, match="never placed there"):
        core.handle(env(finished("n1"), "f2"), 4.0)  # type: ignore[arg-type]


def bound_on_n0() -> PlacerCore:
    placer = PlacerCore(cluster(2, 1))
    launch = Launch(job_id="a", spec=make_job("a").runs_for(ITERATIONS).build(),
                    placement=(("n0", (0,)),))
    placer.handle(env(PlanDecided(cycle=1, term=1, launches=(launch,)), "p1"), 0.0)  # type: ignore[arg-type]
    return placer


def test_the_placer_refuses_the_end_of_a_job_from_a_node_it_never_bound() -> None:
    placer = bound_on_n0()
    with pytest.raises(ValueError, match="node n1 reports the end of job 'a', which was "
                                         r"never bound there \(bound to: n0\)"):
        placer.handle(env(finished("n1")), 0.0)  # type: ignore[arg-type]
    assert placer.bound == {"a": (("n0", (0,)),)}  # n0 keeps running it: nothing stopped
    assert placer.handle(env(finished("n0"), "f0"), 0.0) == [] and placer.bound == {}


def test_the_placer_believes_a_node_the_job_has_left() -> None:
    placer = bound_on_n0()
    moved = PlanDecided(cycle=2, term=1, stops=(Stop(job_id="a", reason="migrate"),),
                        launches=(Launch(job_id="a", spec=make_job("a").runs_for(100).build(),
                                         placement=(("n1", (0,)),)),))
    placer.handle(env(moved, "p2"), 0.0)  # type: ignore[arg-type]
    stops = placer.handle(env(finished("n0"), "f0"), 0.0)  # type: ignore[arg-type]
    assert [e.subject for e in stops if isinstance(e, Publish)] == [subjects.node_command("n1")]


@pytest.mark.parametrize(("subject", "body", "error"), [
    ("loom.node.n0.finished", finished("n0"), None),
    ("loom.node.n0.finished", finished("n1"), "names node 'n1'"),
    ("loom.node.n0.status", NodeStatus(node_id="n1", cycle=1), "names node 'n1'"),
    ("loom.node.n0.heartbeat", NodeHeartbeat(node_id="n1"), "names node 'n1'"),
    ("loom.node.n0.heartbeat", NodeStatus(node_id="n0", cycle=1), "is not accepted on"),
    ("loom.node.n0.status", NodeStatus(node_id="n0", cycle=1), None),
    (subjects.OPERATOR, OperatorCommand(command="cancel", job_id="a"), None),
], ids=["own-node", "other-node-finished", "other-node-status", "other-node-heartbeat",
        "wrong-type", "own-status", "not-a-node-subject"])
def test_a_node_subject_carries_only_its_own_node(subject: str, body: object,
                                                  error: str | None) -> None:
    e = env(body)
    if error is None:
        check_origin(subject, e)  # type: ignore[arg-type]
    else:
        with pytest.raises(CodecError, match=error):
            check_origin(subject, e)  # type: ignore[arg-type]


@pytest.mark.parametrize(("subject", "node"), [
    ("loom.node.n0.finished", "n0"), ("loom.node.gpu-7.heartbeat", "gpu-7"),
    ("loom.node.n0.other", None), ("loom.jobs.submit", None), ("loom.node.status", None),
])
def test_the_node_of_a_subject(subject: str, node: str | None) -> None:
    assert subjects.node_of(subject) == node


@pytest.mark.parametrize(("legacy", "kind"), list(subjects.LEGACY_NODE_SUBJECTS.items()))
def test_a_legacy_shared_subject_maps_to_the_node_it_names(legacy: str, kind: str) -> None:
    assert subjects.current_subject(legacy, "n3") == f"loom.node.n3.{kind}"
    assert subjects.current_subject(subjects.JOB_SUBMIT, "n3") == subjects.JOB_SUBMIT
