"""Node faults on the node agent's side: failed trainers, heartbeats for reconciling."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import trainer as protocol
from schemas.cluster import ClusterSpec
from schemas.events import (
    GpuSlots,
    JobFinished,
    Launch,
    NodeCommand,
    NodeHeartbeat,
    NodeStatus,
    Stop,
    envelope,
)
from services.nodeagent.agent import Kill, TrainerNodeCore, TrainerSettings
from services.runtime.effects import Effect, Publish
from tests.builders import make_job

CLUSTER = ClusterSpec.uniform(1, 2, 2)
N0, N1 = (n.node_id for n in CLUSTER.nodes)
SETTINGS = TrainerSettings(python="py", checkpoint_root=Path("/ckpt"), grace_s=7.0,
                           heartbeat_s=0.5)


def agent(node: int = 0) -> TrainerNodeCore:
    return TrainerNodeCore(CLUSTER.nodes[node], [f"GPU-{node}-a", f"GPU-{node}-b"], SETTINGS)


def launch(job: str, placement: GpuSlots) -> Launch:
    spec = make_job(job).gpus(sum(len(g) for _, g in placement)).iterations(50).build()
    return Launch(job_id=job, spec=spec, placement=placement, iterations_done=5.0)


def command(core: TrainerNodeCore, cycle: int, launches: tuple[Launch, ...] = (),
            stops: tuple[str, ...] = ()) -> list[Effect]:
    cmd = NodeCommand(node_id=core.node.node_id, cycle=cycle, launches=launches,
                      stops=tuple(Stop(job_id=j, reason="r") for j in stops))
    env = envelope(cmd, event_id=f"c{cycle}", occurred_at=0.0, producer="p", causation_id=None)
    return core.handle(env, 0.0)


def bodies(effects: list[Effect]) -> list[object]:
    return [e.body for e in effects if isinstance(e, Publish)]


def progress(job: str, iteration: int) -> protocol.Record:
    return protocol.Progress(job_id=job, rank=0, ts=0, iteration=iteration, iterations_total=50,
                             loss=0.5, throughput=9, samples_per_s=1, fast_forward=False,
                             stages=None)


FAILED = protocol.Failed(job_id="j", rank=0, ts=0, reason="CUDA out of memory",
                         error="OutOfMemoryError", exit_code=1, iteration=12)


@pytest.mark.parametrize(("record", "code", "failure"), [
    (None, 1, "rank 0 exited with 1"),
    (None, -9, "rank 0 exited with -9"),  # killed by someone else (the OOM killer, a person)
    (FAILED, 1, "CUDA out of memory"),  # the trainer's own account comes first
])
def test_a_trainer_that_fails_on_its_own_is_reported_as_a_failure(
        record: protocol.Record | None, code: int, failure: str) -> None:
    core = agent(0)
    command(core, 1, (launch("j", ((N0, (0,)),)),))
    core.on_record("j", 0, progress("j", 10))
    if record is not None:
        core.on_record("j", 0, record)
    done = float(getattr(record, "iteration", None) or 10)
    assert bodies(core.on_exit("j", 0, code)) == [
        JobFinished(job_id="j", node_id=N0, iterations_done=done, failure=failure)]


def test_a_trainer_stopped_by_loom_is_no_failure_whatever_its_exit_code() -> None:
    core = agent(0)
    command(core, 1, (launch("j", ((N0, (0,)),)),))
    assert command(core, 2, stops=("j",)) == [Kill("j", 0, 7.0)]
    assert bodies(core.on_exit("j", 0, -15)) == [
        NodeStatus(node_id=N0, cycle=2, progress={"j": 5.0})]


def test_only_the_leader_reports_a_gang_failure() -> None:
    gang = launch("g", ((N0, (0,)), (N1, (0,))))
    lead, other = agent(0), agent(1)
    command(lead, 1, (gang,))
    command(other, 1, (gang,))
    assert other.on_exit("g", 1, 1) == []
    (failed,) = bodies(lead.on_exit("g", 0, 1))
    assert isinstance(failed, JobFinished) and failed.failure == "rank 0 exited with 1"


def test_heartbeats_list_running_jobs_not_those_stopping() -> None:
    core = agent(0)
    command(core, 1, (launch("a", ((N0, (0,)),)), launch("b", ((N0, (1,)),))))
    command(core, 2, stops=("b",))  # still checkpointing: no need to be told again
    assert bodies(core.on_telemetry([])) == [
        NodeHeartbeat(node_id=N0, jobs=("a",), interval_s=0.5, handled=(0, 2))]


def test_a_reconcile_stop_kills_a_running_job_and_ignores_unknown_ones() -> None:
    core = agent(0)
    command(core, 1, (launch("a", ((N0, (0, 1)),)),))
    assert command(core, -1, stops=("a", "ghost")) == [Kill("a", 0, 7.0), Kill("a", 1, 7.0)]
    assert command(core, -1, stops=("a",)) == []  # already stopping
