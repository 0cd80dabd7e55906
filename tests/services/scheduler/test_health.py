"""Health in scheduling: a node whose own checks fail is cordoned as `loom drain` cordons it,
a GPU whose checks fail is taken out alone, and both come back when a later heartbeat no
longer fails; the reasons show in the scheduler's state (`loom status`); an operator's drain
and a health cordon are kept apart; a report about another node, or about a GPU the node
has not, is refused."""

from __future__ import annotations

import pytest

import policies
from schemas import subjects
from schemas.codec import CodecError, check_origin
from schemas.events import (
    HealthProblem,
    NodeHealth,
    NodeHeartbeat,
    OperatorCommand,
    SubmitJob,
    envelope,
)
from schemas.job import JobState
from services.nodeagent.doctor import CHECKS, PER_GPU
from services.runtime.effects import Effect, SetTimer
from services.scheduler.core import SchedulerConfig, SchedulerCore
from tests.builders import cluster, deliver, make_job


def problem(check: str, gpu: int | None = None, status: str = "fail",
            detail: str = "measured") -> HealthProblem:
    return HealthProblem(check=check, status=status, gpu=gpu, detail=detail)  # type: ignore[arg-type]


def beat(node: str, *problems: HealthProblem, health: bool = True) -> NodeHeartbeat:
    return NodeHeartbeat(node_id=node, interval_s=5.0,
                         health=NodeHealth(problems=problems) if health else None)


def submit(core: SchedulerCore, job: str, gpus: int, now: float) -> None:
    deliver(core, SubmitJob.from_spec(make_job(job).gpus(gpus).runs_for(1000).build()), now)
    core.on_timer("cycle", now)


def cycle_asked(effects: list[Effect]) -> bool:
    return any(isinstance(e, SetTimer) and e.key == "cycle" for e in effects)


def placed(core: SchedulerCore, job: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    rec = core.jobs[job]
    return rec.placement if rec.state is JobState.RUNNING else ()


def scheduler(nodes: int = 2) -> SchedulerCore:
    return SchedulerCore(cluster(nodes, 4), policies.make("fifo"), SchedulerConfig())


# Every check the doctor makes, and what its failure takes out of service.
SCOPES = [(name, 1 if name in PER_GPU else None) for name in CHECKS] + [("gpus", 2)]


@pytest.mark.parametrize(("check", "gpu"), SCOPES,
                         ids=[f"{c}-gpu{g}" if g is not None else c for c, g in SCOPES])
def test_a_failed_check_cordons_the_node_or_takes_its_gpu_out_and_passing_lifts_it(
        check: str, gpu: int | None) -> None:
    core = scheduler()
    effects = deliver(core, beat("n0", problem(check, gpu, detail=f"{check} broke")), 1.0)
    assert cycle_asked(effects)
    state = core.state(1.0)
    if gpu is None:
        assert core.drained == {"n0"} and core.faults.gpus_out == {}
        assert state["cordoned"] == {"n0": {"health": f"{check}: {check} broke"}}
        assert state["drained"] == []  # not an operator's drain
    else:
        assert core.drained == set() and core.topology.out == {"n0": 1 << gpu}
        assert state["gpus_out"] == {"n0": {str(gpu): f"{check}: {check} broke"}}
    core.on_timer("cycle", 1.0)
    assert cycle_asked(deliver(core, beat("n0"), 2.0))  # passes again
    assert core.drained == set() and core.topology.out == {} and core.faults.gpus_out == {}
    assert core.state(2.0)["cordoned"] == {} and core.state(2.0)["gpus_out"] == {}


def test_warnings_are_shown_and_change_nothing() -> None:
    core = scheduler()
    effects = deliver(core, beat("n0", problem("dcgm", status="warn", detail="absent"),
                                 problem("throttle", 0, "warn", "GPU 0: power brake")), 1.0)
    assert not cycle_asked(effects)
    assert core.drained == set() and core.topology.out == {}
    assert core.state(1.0)["health_warnings"] == {
        "n0": "dcgm: absent; throttle: GPU 0: power brake"}


def test_a_cordoned_node_takes_no_new_work_until_its_checks_pass() -> None:
    core = scheduler()
    deliver(core, beat("n0", problem("checkpoint", detail="/ckpt not writable")), 0.0)
    submit(core, "a", 4, 0.0)
    submit(core, "b", 4, 1.0)
    assert placed(core, "a") == (("n1", (0, 1, 2, 3)),) and placed(core, "b") == ()
    deliver(core, beat("n0", problem("checkpoint", detail="/ckpt still")), 2.0)
    core.on_timer("cycle", 2.0)
    assert placed(core, "b") == ()  # still failing: still cordoned, nothing placed
    deliver(core, beat("n0"), 3.0)
    core.on_timer("cycle", 3.0)
    assert placed(core, "b") == (("n0", (0, 1, 2, 3)),)


def test_a_gpu_taken_out_alone_leaves_the_rest_of_its_node_in_use() -> None:
    core = scheduler()
    deliver(core, beat("n0", problem("ecc", 1, detail="GPU 1: 2 uncorrectable")), 0.0)
    submit(core, "whole", 4, 0.0)  # n0 has 3 GPUs left: the whole node is n1
    assert placed(core, "whole") == (("n1", (0, 1, 2, 3)),)
    submit(core, "three", 3, 1.0)
    assert placed(core, "three") == (("n0", (0, 2, 3)),)
    deliver(core, beat("n0"), 2.0)  # the GPU is back (reset)
    submit(core, "one", 1, 2.0)
    assert placed(core, "one") == (("n0", (1,)),)


def test_a_job_running_on_a_gpu_taken_out_goes_on_there() -> None:
    core = scheduler(1)
    submit(core, "a", 2, 0.0)
    assert placed(core, "a") == (("n0", (0, 1)),)
    deliver(core, beat("n0", problem("xid", 1, detail="GPU 1: XID 79")), 1.0)
    submit(core, "b", 3, 1.0)  # needs GPU 1 too: waits
    core.on_timer("cycle", 2.0)
    assert placed(core, "a") == (("n0", (0, 1)),) and placed(core, "b") == ()
    submit(core, "c", 2, 3.0)
    assert placed(core, "c") == (("n0", (2, 3)),)


def test_an_operators_drain_and_a_health_cordon_are_kept_apart() -> None:
    core = scheduler()
    deliver(core, OperatorCommand(command="drain", node_id="n0", requested_by="ann"), 0.0)
    deliver(core, beat("n0", problem("mps", detail="did not start")), 1.0)
    assert core.state(1.0)["cordoned"] == {"n0": {"operator": "drained by ann",
                                                  "health": "mps: did not start"}}
    deliver(core, beat("n0"), 2.0)  # healthy again: the operator's drain stays
    assert core.drained == {"n0"} and core.state(2.0)["drained"] == ["n0"]
    deliver(core, beat("n0", problem("nccl")), 3.0)
    deliver(core, OperatorCommand(command="undrain", node_id="n0"), 4.0)
    assert core.drained == {"n0"}  # still failing its checks
    assert core.state(4.0)["drained"] == [] and "health" in core.state(4.0)["cordoned"]["n0"]
    deliver(core, beat("n0"), 5.0)
    assert core.drained == set()


def test_a_heartbeat_without_a_report_lifts_what_an_earlier_one_imposed() -> None:
    core = scheduler()
    deliver(core, beat("n0", problem("torch"), problem("ecc", 0)), 1.0)
    assert core.drained == {"n0"} and core.topology.out == {"n0": 1}
    deliver(core, beat("n0", health=False), 2.0)  # an agent run with --no-health-checks
    assert core.drained == set() and core.topology.out == {}


def test_only_changes_ask_for_a_cycle() -> None:
    core = scheduler()
    assert cycle_asked(deliver(core, beat("n0", problem("ecc", 0, detail="1 error")), 1.0))
    core.on_timer("cycle", 1.0)
    # Still failing (the measured value moved): the reason is updated, no cycle.
    assert not cycle_asked(deliver(core, beat("n0", problem("ecc", 0, detail="2 errors")), 2.0))
    assert core.faults.gpus_out == {"n0": {0: "ecc: 2 errors"}}
    assert not cycle_asked(deliver(core, beat("n1"), 2.0))


def test_a_forged_report_about_another_node_is_refused_on_the_wire() -> None:
    forged = envelope(beat("n1", problem("ecc", 0)), event_id="x", occurred_at=0.0,
                      producer="nodeagent-n0", causation_id=None)
    with pytest.raises(CodecError, match="names node 'n1': a node speaks only for itself"):
        check_origin(subjects.node_subject("n0", subjects.HEARTBEAT), forged)
    check_origin(subjects.node_subject("n1", subjects.HEARTBEAT), forged)  # its own: fine


def test_a_report_about_a_gpu_the_node_has_not_is_refused_whole() -> None:
    core = scheduler()
    with pytest.raises(ValueError, match="names GPU 4 of a node with 4 GPUs"):
        deliver(core, beat("n0", problem("torch"), problem("ecc", 4)), 1.0)
    assert core.drained == set() and core.topology.out == {}
    assert "n0" not in core.faults.watched  # nothing of the heartbeat was taken either
