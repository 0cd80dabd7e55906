"""Idempotent, fenced node commands: `CommandGate`, and the simulated node agent behind it."""

from __future__ import annotations

import pytest

from domain.overhead import parse_overhead
from schemas.cluster import NodeSpec
from schemas.events import (
    STOP_GANG_FINISHED,
    STOP_RECONCILE,
    JobFinished,
    Launch,
    NodeCommand,
    Stop,
    envelope,
)
from services.nodeagent.gate import CommandGate
from services.nodeagent.simfleet import SimNodeCore
from services.runtime.effects import Publish, SetTimer
from tests.builders import make_job

NODE = NodeSpec(node_id="n0", switch_id="s0", gpus=4)


def launch(job: str) -> Launch:
    return Launch(job_id=job, spec=make_job(job).runs_for(100).build(),
                  placement=(("n0", (0,)),))


def cmd(term: int, cycle: int, launches: tuple[str, ...] = (), stops: tuple[str, ...] = ()
        ) -> NodeCommand:
    return NodeCommand(node_id="n0", cycle=cycle, term=term,
                       launches=tuple(launch(j) for j in launches),
                       stops=tuple(Stop(job_id=j, reason="preempted") for j in stops))


def carried_out(gate: CommandGate, c: NodeCommand) -> tuple[list[str], list[str]]:
    out = gate.admit(c)
    if out is None:
        return [], []
    return [x.job_id for x in out.launches], [s.job_id for s in out.stops]


# Each case: the commands a node receives, in order, and what the last one carries out.
CASES = {
    "first launch": ([cmd(0, 1, ("a",))], (["a"], [])),
    "re-delivered launch": ([cmd(0, 1, ("a",)), cmd(0, 1, ("a",))], ([], [])),
    "launch after a stop, next cycle": (
        [cmd(0, 1, ("a",)), cmd(0, 2, stops=("a",)), cmd(0, 3, ("a",))], (["a"], [])),
    "re-delivered stop after a relaunch is stale": (
        [cmd(0, 1, ("a",)), cmd(0, 2, stops=("a",)), cmd(0, 3, ("a",)),
         cmd(0, 2, stops=("a",))], ([], [])),
    "migration: stop and launch in one command": (
        [cmd(0, 1, ("a",)), cmd(0, 2, ("a",), ("a",))], (["a"], ["a"])),
    "older term is dropped whole": (
        [cmd(2, 5, ("a",)), cmd(1, 9, ("b",), ("a",))], ([], [])),
    "newer term goes through, whatever its cycle": (
        [cmd(1, 9, ("a",)), cmd(2, 3, ("b",), ("a",))], (["b"], ["a"])),
    "part of a command is new": ([cmd(0, 1, ("a",)), cmd(0, 1, ("a", "b"))], (["b"], [])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gate(name: str) -> None:
    commands, expected = CASES[name]
    gate = CommandGate()
    for c in commands[:-1]:
        gate.admit(c)
    assert carried_out(gate, commands[-1]) == expected


def test_the_gate_knows_the_newest_plan_command_it_carried_out() -> None:
    """Heartbeats carry it: a run launched by that plan or an older one must be listed."""
    gate = CommandGate()
    assert gate.handled is None
    for c, handled in [(cmd(0, 3, ("a",)), (0, 3)), (cmd(0, 2, ("b",)), (0, 3)),
                       (out_of_cycle("a", STOP_RECONCILE), (0, 3)), (cmd(1, 1), (1, 1)),
                       (cmd(0, 9, ("c",)), (1, 1))]:  # re-delivered, out of cycle, old term
        gate.admit(c)
        assert gate.handled == handled


def test_a_finished_job_never_starts_again() -> None:
    gate = CommandGate()
    gate.admit(cmd(0, 1, ("a",)))
    gate.finish("a")
    assert carried_out(gate, cmd(0, 7, ("a",))) == ([], [])
    assert gate.dropped == 1


def out_of_cycle(job: str, reason: str) -> NodeCommand:
    return NodeCommand(node_id="n0", cycle=-1, stops=(Stop(job_id=job, reason=reason),))


@pytest.mark.parametrize(("reason", "relaunched"), [
    (STOP_GANG_FINISHED, []),  # the gang is done: never here again
    # A heartbeat crossed a preemption: the job only stopped, and comes back later (a demo
    # run hung when this stop counted as finished and its relaunch here was dropped).
    (STOP_RECONCILE, ["a"]),
])
def test_out_of_cycle_stops_always_apply(reason: str, relaunched: list[str]) -> None:
    gate = CommandGate()
    gate.admit(cmd(0, 4, ("a",)))
    assert carried_out(gate, cmd(0, 5, stops=("a",))) == ([], ["a"])
    assert carried_out(gate, out_of_cycle("a", reason)) == ([], ["a"])
    assert carried_out(gate, cmd(0, 6, ("a",))) == (relaunched, [])


def test_sim_node_finishes_a_redelivered_job_once() -> None:
    core = SimNodeCore(NODE, parse_overhead("none"))

    def deliver(c: NodeCommand, now: float) -> list[object]:
        return list(core.handle(envelope(c, event_id="same", occurred_at=now, producer="placer",
                                         causation_id=None), now))

    (timer,) = deliver(cmd(0, 1, ("a",)), 0.0)
    assert isinstance(timer, SetTimer) and timer.at == 100.0
    assert deliver(cmd(0, 1, ("a",)), 50.0) == []  # progress is not reset
    (done,) = core.on_timer(("finish", "n0", "a"), 100.0)
    assert isinstance(done, Publish) and isinstance(done.body, JobFinished)
    assert deliver(cmd(0, 1, ("a",)), 120.0) == []  # after the finish: never again
    assert core.jobs == {}


def plan_env(event_id: str, term: int, cycle: int, *launches: Launch) -> object:
    from schemas.events import PlanDecided
    return envelope(PlanDecided(cycle=cycle, term=term, launches=launches),
                    event_id=event_id, occurred_at=0.0, producer="scheduler", causation_id=None)


def test_placer_binds_a_redelivered_plan_once_and_refuses_older_terms() -> None:
    from services.placer.core import PlacerCore
    from services.placer.refusals import HeldByAnother, StaleTerm
    from services.runtime.service import RetryLater
    from tests.builders import cluster

    placer = PlacerCore(cluster(1, 4))
    first = placer.handle(plan_env("p1", 2, 5, launch("a")), 0.0)  # type: ignore[arg-type]
    assert [e.body.term for e in first if isinstance(e, Publish)] == [2]  # type: ignore[attr-defined]
    assert placer.handle(plan_env("p1", 2, 5, launch("a")), 0.0) == []  # type: ignore[arg-type]
    with pytest.raises(StaleTerm, match="term 1; the leader's term is 2"):
        placer.handle(plan_env("old", 1, 9, launch("b")), 0.0)  # type: ignore[arg-type]
    # A launch onto a GPU still held may be waiting for a finish in flight: retried, not lost.
    with pytest.raises(HeldByAnother, match="held by job a") as caught:
        placer.handle(plan_env("p2", 2, 6, launch("b")), 0.0)  # type: ignore[arg-type]
    assert isinstance(caught.value, RetryLater)
    assert set(placer.bound) == {"a"}


def test_a_plan_made_before_a_jobs_completion_does_not_launch_it_again() -> None:
    """A plan and the finish report of a job it relaunches cross on their way to the placer
    (separate consumers): the completed job is not bound, so its GPU stays free for the next
    plan instead of being held for a job no node will run (found by the chaos test)."""
    from services.placer.core import PlacerCore
    from tests.builders import cluster

    def finished(job: str, failure: str | None = None) -> object:
        return envelope(JobFinished(job_id=job, node_id="n0", iterations_done=100.0,
                                    failure=failure),
                        event_id=f"f-{job}", occurred_at=0.0, producer="n0", causation_id=None)

    placer = PlacerCore(cluster(1, 4))
    placer.handle(plan_env("p1", 1, 1, launch("a")), 0.0)  # type: ignore[arg-type]
    placer.handle(finished("a"), 0.0)  # type: ignore[arg-type]
    # Decided before a's report: relaunches a on n0:0. Then b is planned onto that GPU.
    late = placer.handle(plan_env("p2", 1, 2, launch("a")), 0.0)  # type: ignore[arg-type]
    assert late == [] and placer.bound == {}
    nxt = placer.handle(plan_env("p3", 1, 3, launch("b")), 0.0)  # type: ignore[arg-type]
    assert [x.job_id for e in nxt if isinstance(e, Publish)
            for x in e.body.launches] == ["b"]  # type: ignore[attr-defined]
    # A job that failed may be retried: a later launch of it is bound as usual.
    placer.handle(finished("b", failure="exit 1"), 0.0)  # type: ignore[arg-type]
    placer.handle(plan_env("p4", 1, 4, launch("b")), 0.0)  # type: ignore[arg-type]
    assert set(placer.bound) == {"b"}


def test_a_failure_from_a_run_the_job_has_left_does_not_stop_its_current_run() -> None:
    from schemas.events import PlanDecided, Stop
    from services.placer.core import PlacerCore
    from tests.builders import cluster

    placer = PlacerCore(cluster(2, 4))
    on_n1 = Launch(job_id="a", spec=make_job("a").runs_for(100).build(),
                   placement=(("n1", (0,)),))
    placer.handle(plan_env("p1", 1, 1, launch("a")), 0.0)  # type: ignore[arg-type]
    moved = PlanDecided(cycle=2, term=1, stops=(Stop(job_id="a", reason="migrate"),),
                        launches=(on_n1,))
    placer.handle(envelope(moved, event_id="p2", occurred_at=0.0, producer="scheduler",
                           causation_id=None), 0.0)
    stale = envelope(JobFinished(job_id="a", node_id="n0", iterations_done=5.0, failure="oom"),
                     event_id="f1", occurred_at=0.0, producer="n0", causation_id=None)
    assert placer.handle(stale, 0.0) == [] and placer.bound == {"a": (("n1", (0,)),)}
    done = envelope(JobFinished(job_id="a", node_id="n0", iterations_done=100.0),
                    event_id="f2", occurred_at=0.0, producer="n0", causation_id=None)
    stops = placer.handle(done, 0.0)  # all the work, done there: the run on n1 is stopped
    assert [e.body.node_id for e in stops if isinstance(e, Publish)] == ["n1"]  # type: ignore[attr-defined]
    assert placer.bound == {}
