"""PlacerCore: binds PlanDecided to node commands and guards the GPU inventory."""

from __future__ import annotations

import itertools

import pytest
from pydantic import BaseModel

from schemas import subjects
from schemas.events import (
    STOP_GANG_FAILED,
    STOP_GANG_FINISHED,
    CycleStarted,
    Envelope,
    GpuSlots,
    JobFinished,
    Launch,
    NodeCommand,
    PlanDecided,
    Stop,
    envelope,
)
from services.nodeagent.gate import CommandGate
from services.placer import core as placer_core
from services.placer.core import PlacerCore
from services.placer.refusals import DoubleBooking, StillBound
from services.runtime.effects import Effect, Publish
from services.runtime.service import RetryLater
from tests.builders import cluster, make_job

_ids = itertools.count()


def env(body: BaseModel) -> Envelope:
    return envelope(body, event_id=f"e{next(_ids)}", occurred_at=0.0, producer="test",
                    causation_id=None)


def launch(job_id: str, placement: GpuSlots) -> Launch:
    gpus = sum(len(idx) for _, idx in placement)
    spec = make_job(job_id).gpus(max(gpus, 1)).build()
    return Launch(job_id=job_id, spec=spec, placement=placement)


def stop(job_id: str, reason: str = "preempted") -> Stop:
    return Stop(job_id=job_id, reason=reason)


def plan(cycle: int = 1, launches: tuple[Launch, ...] = (),
         stops: tuple[Stop, ...] = ()) -> PlanDecided:
    return PlanDecided(cycle=cycle, launches=launches, stops=stops)


def commands(effects: list[Effect]) -> dict[str, NodeCommand]:
    out: dict[str, NodeCommand] = {}
    for e in effects:
        assert isinstance(e, Publish)
        assert isinstance(e.body, NodeCommand)
        assert e.subject == subjects.node_command(e.body.node_id)
        assert e.body.node_id not in out, "one command per node"
        out[e.body.node_id] = e.body
    return out


def summary(effects: list[Effect]) -> dict[str, tuple[list[str], list[str]]]:
    """node → (stopped job ids, launched job ids)."""
    return {n: ([s.job_id for s in c.stops], [lc.job_id for lc in c.launches])
            for n, c in commands(effects).items()}


def placer(nodes: int = 3, gpus: int = 4) -> PlacerCore:
    return PlacerCore(cluster(nodes, gpus))


def bind(core: PlacerCore, *launches: Launch, stops: tuple[Stop, ...] = (),
         cycle: int = 1) -> list[Effect]:
    return core.handle(env(plan(cycle, tuple(launches), stops)), 0.0)


# --------------------------------------------------------------------------------------------
# plans → node commands
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("launches", "expected"),
    [
        pytest.param([launch("a", (("n1", (0, 1)),))], {"n1": ([], ["a"])}, id="one-node"),
        pytest.param([launch("a", (("n0", (0, 1, 2, 3)), ("n2", (0,))))],
                     {"n0": ([], ["a"]), "n2": ([], ["a"])}, id="gang-to-each-node"),
        pytest.param([launch("a", (("n0", (0,)),)), launch("b", (("n0", (1,)),)),
                      launch("c", (("n2", (3,)),))],
                     {"n0": ([], ["a", "b"]), "n2": ([], ["c"])}, id="grouped-by-node"),
        pytest.param([], {}, id="empty-plan-no-commands"),
    ],
)
def test_launches_go_to_exactly_the_nodes_that_change(
    launches: list[Launch], expected: dict[str, tuple[list[str], list[str]]]
) -> None:
    core = placer()
    effects = bind(core, *launches, cycle=7)
    assert summary(effects) == expected
    assert all(c.cycle == 7 for c in commands(effects).values())
    for lc in launches:
        assert core.bound[lc.job_id] == lc.placement
        for node, idx in lc.placement:
            assert all(core.owner[(node, i)] == {lc.job_id} for i in idx)


def test_gang_launch_carries_the_same_launch_to_every_node() -> None:
    core = placer()
    lc = launch("a", (("n0", (0, 1, 2, 3)), ("n1", (0, 1))))
    cmds = commands(bind(core, lc))
    assert cmds["n0"].launches == cmds["n1"].launches == (lc,)


def test_commands_follow_cluster_node_order() -> None:
    core = placer()
    effects = bind(core, launch("z", (("n2", (0,)),)), launch("y", (("n0", (0,)),)),
                   launch("x", (("n1", (0,)),)))
    assert list(commands(effects)) == ["n0", "n1", "n2"]  # dict keeps the effect order


def test_stops_are_applied_before_launches_so_freed_gpus_can_be_reused() -> None:
    core = placer()
    bind(core, launch("old", (("n0", (0, 1)),)), launch("keep", (("n1", (0,)),)))
    effects = bind(core, launch("new", (("n0", (0, 1)),)), stops=(stop("old"),), cycle=2)
    # Only n0 changes: it is told to stop `old` and start `new`; n1 hears nothing.
    assert summary(effects) == {"n0": (["old"], ["new"])}
    assert core.owner[("n0", 0)] == core.owner[("n0", 1)] == {"new"}
    assert "old" not in core.bound and "keep" in core.bound


def test_stopping_a_gang_tells_each_of_its_nodes() -> None:
    core = placer()
    bind(core, launch("g", (("n0", (0, 1, 2, 3)), ("n2", (0, 1)))))
    effects = bind(core, stops=(stop("g"),), cycle=2)
    assert summary(effects) == {"n0": (["g"], []), "n2": (["g"], [])}
    assert core.owner == {} and core.bound == {}


def test_migration_stop_and_relaunch_of_the_same_job_in_one_plan() -> None:
    core = placer()
    bind(core, launch("m", (("n0", (0, 1)),)))
    new = launch("m", (("n1", (2, 3)),))
    effects = bind(core, new, stops=(stop("m", "migrated"),), cycle=2)
    assert summary(effects) == {"n0": (["m"], []), "n1": ([], ["m"])}
    assert core.bound["m"] == new.placement
    assert ("n0", 0) not in core.owner


def test_stop_for_an_unbound_job_sends_nothing() -> None:
    core = placer()
    assert bind(core, stops=(stop("ghost"),)) == []


# --------------------------------------------------------------------------------------------
# JobFinished
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("placement", "reporter", "told"),
    [
        pytest.param((("n0", (0, 1)),), "n0", [], id="single-node-nobody-else"),
        pytest.param((("n0", (0, 1, 2, 3)), ("n1", (0,)), ("n2", (1,))), "n0", ["n1", "n2"],
                     id="gang-leader-reports"),
        pytest.param((("n0", (0, 1, 2, 3)), ("n1", (0,))), "n1", ["n0"],
                     id="other-member-reports"),
    ],
)
def test_finish_frees_gpus_and_stops_the_other_nodes_of_a_gang(
    placement: GpuSlots, reporter: str, told: list[str]
) -> None:
    core = placer()
    bind(core, launch("a", placement))
    effects = core.handle(env(JobFinished(job_id="a", node_id=reporter, iterations_done=100)),
                          5.0)
    cmds = commands(effects)
    assert sorted(cmds) == told
    for c in cmds.values():
        assert c.launches == ()
        assert [(s.job_id, s.reason) for s in c.stops] == [("a", "finished")]
    assert core.owner == {} and "a" not in core.bound
    # The GPUs really are free: another job can be launched onto them.
    bind(core, launch("b", placement), cycle=2)
    assert core.bound["b"] == placement


@pytest.mark.parametrize(("failure", "reason"), [
    (None, STOP_GANG_FINISHED),
    ("rank 0 exited with 1", STOP_GANG_FAILED),
    ("recorded failure: the trace's job failed here, at iteration 30 of 100", STOP_GANG_FAILED),
])
def test_a_gang_whose_run_failed_is_not_finished_on_its_other_nodes(
        failure: str | None, reason: str) -> None:
    """Its followers stop, and only a completed job is done there for good: a failed one may
    be retried on them (their agents would refuse a job "finished" there)."""
    core = placer()
    bind(core, launch("a", (("n0", (0, 1, 2, 3)), ("n1", (0,)))))
    effects = core.handle(env(JobFinished(job_id="a", node_id="n0", iterations_done=30,
                                          failure=failure)), 5.0)
    (cmd,) = commands(effects).values()
    assert [(s.job_id, s.reason) for s in cmd.stops] == [("a", reason)]
    gate = CommandGate()
    gate.admit(cmd)
    relaunch = NodeCommand(node_id="n1", cycle=2, launches=(launch("a", (("n0", (0,)),)),))
    assert (gate.admit(relaunch) is None) is (failure is None)


def test_the_latest_completions_are_remembered_against_launches_decided_before_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan decided before a job completed may still launch it: the placer drops that
    launch for the last COMPLETED_MEMORY completions, and forgets the oldest first."""
    monkeypatch.setattr(placer_core, "COMPLETED_MEMORY", 2)
    core = placer()
    for k, job in enumerate("abc"):
        bind(core, launch(job, (("n0", (k,)),)), cycle=k)
        core.handle(env(JobFinished(job_id=job, node_id="n0", iterations_done=100)), 1.0)
    late = [launch(job, (("n1", (k,)),)) for k, job in enumerate("abc")]
    assert summary(bind(core, *late, cycle=9)) == {"n1": ([], ["a"])}  # b and c: completed


def test_a_redelivered_plan_binds_once_while_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placer_core, "APPLIED_MEMORY", 2)
    core = placer()
    first = env(plan(1, (launch("a", (("n0", (0,)),)),)))
    assert summary(core.handle(first, 0.0)) == {"n0": ([], ["a"])}
    assert core.handle(first, 0.0) == []  # re-delivered: already bound
    for cycle in (2, 3):  # two newer plans: the first is forgotten, and binds again
        bind(core, cycle=cycle)
    with pytest.raises(StillBound):
        core.handle(first, 0.0)


def test_finish_of_an_unknown_job_is_ignored() -> None:
    core = placer()
    bind(core, launch("a", (("n0", (0,)),)))
    assert core.handle(env(JobFinished(job_id="zz", node_id="n0", iterations_done=1)), 0) == []
    assert core.bound == {"a": (("n0", (0,)),)}


def test_unexpected_event_type_is_refused() -> None:
    with pytest.raises(TypeError):
        placer().handle(env(CycleStarted(cycle=1, trigger="x")), 0.0)


# --------------------------------------------------------------------------------------------
# double booking
# --------------------------------------------------------------------------------------------

# `transient`: what a live placer's bus retries (RetryLater), because the report that frees
# the GPUs or the job may only be late on the placer's own consumer; the rest is dead-lettered.
@pytest.mark.parametrize(
    ("bad", "message", "transient"),
    [
        pytest.param(launch("b", (("n0", (1, 2)),)), "held by job a", True,
                     id="gpu-held-by-other"),
        pytest.param(launch("b", (("n1", (0,)), ("n0", (3,)))), "held by job a", True,
                     id="gang-partly-on-held-gpu"),
        pytest.param(launch("b", (("n9", (0,)),)), "unknown node", False, id="unknown-node"),
        pytest.param(launch("b", (("n1", (4,)),)), "has no GPU 4", False,
                     id="gpu-index-too-high"),
        pytest.param(launch("b", (("n1", (-1,)),)), "has no GPU -1", False, id="negative-gpu"),
        # A retry after a failure whose report the placer has not read yet (the chaos test
        # dead-lettered such a plan after the nats-server restart).
        pytest.param(launch("a", (("n2", (0,)),)), "still bound", True, id="job-already-bound"),
    ],
)
def test_double_booking_is_refused(bad: Launch, message: str, transient: bool) -> None:
    core = placer()
    bind(core, launch("a", (("n0", (0, 1, 2, 3)),)))
    with pytest.raises(DoubleBooking, match=message) as refused:
        bind(core, bad, cycle=2)
    assert isinstance(refused.value, RetryLater) is transient
    assert "b" not in core.bound
    assert core.bound["a"] == (("n0", (0, 1, 2, 3)),)


def test_two_launches_onto_one_gpu_in_the_same_plan_are_refused() -> None:
    core = placer()
    with pytest.raises(DoubleBooking, match="held by job a"):
        bind(core, launch("a", (("n0", (0, 1)),)), launch("b", (("n0", (1, 2)),)))


def test_stop_of_another_job_does_not_free_a_held_gpu() -> None:
    core = placer()
    bind(core, launch("a", (("n0", (0,)),)), launch("c", (("n1", (0,)),)))
    with pytest.raises(DoubleBooking):
        bind(core, launch("b", (("n0", (0,)),)), stops=(stop("c"),), cycle=2)


@pytest.mark.parametrize(
    "placement",
    [pytest.param((("n0", (0, 0)),), id="same-gpu-twice"),
     pytest.param((("n0", (0,)), ("n0", (0,))), id="same-node-twice")],
)
def test_launch_naming_a_gpu_twice_is_a_double_booking(placement: GpuSlots) -> None:
    core = placer()
    with pytest.raises(DoubleBooking):
        bind(core, launch("a", placement))


def test_a_colocated_group_shares_gpus_and_releases_them_member_by_member() -> None:
    core = PlacerCore(cluster(1, 4))
    slots: GpuSlots = (("n0", (0, 1)),)
    group = ("a", "b")
    plan = PlanDecided(cycle=1, launches=tuple(
        Launch(job_id=j, spec=make_job(j).gpus(2).build(), placement=slots, colocated=group)
        for j in group))
    cmds = core.handle(envelope(plan, event_id="p", occurred_at=0.0, producer="t",
                                causation_id=None), 0.0)
    assert len(cmds) == 1 and core.owner[("n0", 0)] == {"a", "b"}
    core.handle(envelope(JobFinished(job_id="a", node_id="n0", iterations_done=1),
                         event_id="f", occurred_at=1.0, producer="t", causation_id=None), 1.0)
    assert core.owner[("n0", 0)] == {"b"}  # still held by the other member
    outsider = PlanDecided(cycle=2, launches=(
        Launch(job_id="c", spec=make_job("c").gpus(2).build(), placement=slots),))
    with pytest.raises(DoubleBooking, match="held by job b"):
        core.handle(envelope(outsider, event_id="q", occurred_at=2.0, producer="t",
                             causation_id=None), 2.0)
