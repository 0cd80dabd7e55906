"""The live node agent's core: ranks, rendezvous, spawns and kills, and what it reports."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from domain.trainer_config import parse
from schemas import subjects
from schemas import trainer as protocol
from schemas.cluster import ClusterSpec
from schemas.events import (
    CycleStarted,
    GpuInfo,
    GpuLink,
    GpuSample,
    GpuSlots,
    JobFinished,
    Launch,
    NodeCommand,
    NodeHeartbeat,
    NodeInfo,
    NodeStatus,
    Stop,
    TrainerReport,
    envelope,
)
from services.nodeagent.agent import (
    Kill,
    SampleGpus,
    Spawn,
    TrainerNodeCore,
    TrainerSettings,
    global_batch,
    local_ranks,
    rendezvous_port,
)
from services.runtime.effects import PRIORITY_INPUT, Effect, Publish, SetTimer
from tests.builders import make_job

CLUSTER = ClusterSpec.uniform(1, 2, 2)
N0, N1 = (n.node_id for n in CLUSTER.nodes)
SETTINGS = TrainerSettings(python="py", checkpoint_root=Path("/ckpt"), grace_s=7.0)


def agent(node: int = 0) -> TrainerNodeCore:
    return TrainerNodeCore(CLUSTER.nodes[node], [f"GPU-{node}-a", f"GPU-{node}-b"], SETTINGS)


def launch(job: str, placement: GpuSlots, model: str = "resnet18", iterations: int = 50
           ) -> Launch:
    spec = make_job(job).gpus(sum(len(g) for _, g in placement)).iterations(iterations) \
        .model(model).build()
    return Launch(job_id=job, spec=spec, placement=placement)


def command(node: str, cycle: int, launches: tuple[Launch, ...] = (),
            stops: tuple[Stop, ...] = ()) -> object:
    return envelope(NodeCommand(node_id=node, cycle=cycle, launches=launches, stops=stops),
                    event_id=f"c{cycle}{node}", occurred_at=0.0, producer="placer",
                    causation_id=None)


def spawns(effects: list[Effect]) -> list[Spawn]:
    return [e for e in effects if isinstance(e, Spawn)]


def bodies(effects: list[Effect]) -> list[object]:
    return [e.body for e in effects if isinstance(e, Publish)]


@pytest.mark.parametrize(("placement", "node", "ranks", "world"), [
    (((N0, (0,)),), N0, {0: 0}, 1),
    (((N0, (0, 1)),), N0, {0: 0, 1: 1}, 2),
    (((N0, (1,)), (N1, (0, 1))), N1, {1: 0, 2: 1}, 3),  # ranks follow the placement
    (((N0, (1,)), (N1, (0, 1))), N0, {0: 1}, 3),
])
def test_local_ranks(placement: GpuSlots, node: str, ranks: dict[int, int], world: int) -> None:
    assert local_ranks(node, launch("j", placement)) == (ranks, world)


@pytest.mark.parametrize(("batch", "world", "expected"), [
    (None, 1, 32), (None, 3, 33), (64, 4, 64), (10, 4, 12)])
def test_global_batch_splits_evenly(batch: int | None, world: int, expected: int) -> None:
    assert global_batch(batch, world) == expected


@pytest.mark.parametrize(("placement", "apart"), [
    pytest.param(((N0, (0, 1)),), True, id="a-gang-on-one-node-by-its-root"),
    pytest.param(((N0, (0,)), (N1, (0,))), False, id="a-gang-across-nodes-as-every-node"),
])
def test_clusters_sharing_a_host_draw_rendezvous_ports_apart(placement: GpuSlots,
                                                             apart: bool) -> None:
    """Two clusters (two test stacks) on one host, the same job id and cycle: a gang on one
    node takes its port from its node's checkpoint root too; a gang across nodes cannot (its
    nodes need not share a root), and takes the port every node computes."""
    ports = set()
    for root in ("/ckpt", "/other"):
        settings = replace(SETTINGS, checkpoint_root=Path(root))
        core = TrainerNodeCore(CLUSTER.nodes[0], ["GPU-0-a", "GPU-0-b"], settings)
        (first, *_) = spawns(core.handle(command(N0, 5, (launch("g", placement),)), 0.0))  # type: ignore[arg-type]
        ports.add(parse(list(first.argv[3:])).master_port)
    assert len(ports) == (2 if apart else 1)


def test_a_gang_across_nodes_agrees_on_rendezvous_without_talking() -> None:
    gang = launch("g", ((N0, (0, 1)), (N1, (0,))))
    left = spawns(agent(0).handle(command(N0, 5, (gang,)), 0.0))  # type: ignore[arg-type]
    right = spawns(agent(1).handle(command(N1, 5, (gang,)), 0.0))  # type: ignore[arg-type]
    configs = [parse(list(s.argv[3:])) for s in left + right]
    assert [c.rank for c in configs] == [0, 1, 2]
    assert {(c.world_size, c.master_addr, c.master_port) for c in configs} == {
        (3, "127.0.0.1", rendezvous_port("g", 5))}
    assert [s.gpu_uuids for s in left + right] == [("GPU-0-a",), ("GPU-0-b",), ("GPU-1-a",)]
    assert {c.model for c in configs} == {"cnn"}  # resnet18 → the CNN family
    assert all(s.checkpoint_dir == "/ckpt/g" and s.argv[:3] == ("py", "-m", "services.trainer")
               for s in left + right)
    assert rendezvous_port("g", 6) != rendezvous_port("g", 5)  # a relaunch gets a fresh port


def test_stop_kills_every_local_rank_and_reports_the_checkpointed_progress() -> None:
    core = agent(0)
    core.handle(command(N0, 1, (launch("j", ((N0, (0, 1)),)),)), 0.0)  # type: ignore[arg-type]
    core.on_record("j", 0, protocol.Progress(job_id="j", rank=0, ts=0, iteration=20,
                                             iterations_total=50, loss=0.5, throughput=9,
                                             samples_per_s=1, fast_forward=False, stages=None))
    effects = core.handle(command(N0, 2, stops=(Stop(job_id="j", reason="preempt"),)),
                          0.0)  # type: ignore[arg-type]
    assert effects == [Kill("j", 0, 7.0), Kill("j", 1, 7.0)]
    core.on_record("j", 0, protocol.Stopped(job_id="j", rank=0, ts=0, iteration=23,
                                            signal="SIGTERM", loss=0.4, param_digest="x",
                                            profile=None))
    assert core.on_exit("j", 1, 0) == []  # rank 0 still checkpointing
    [status] = bodies(core.on_exit("j", 0, 0))
    assert status == NodeStatus(node_id=N0, cycle=2, progress={"j": 23.0})
    assert core.jobs == {}


def test_the_leader_reports_completion_and_progress_others_stay_silent() -> None:
    gang = launch("g", ((N0, (0,)), (N1, (0,))))
    lead, other = agent(0), agent(1)
    lead.handle(command(N0, 1, (gang,)), 0.0)  # type: ignore[arg-type]
    other.handle(command(N1, 1, (gang,)), 0.0)  # type: ignore[arg-type]
    report = lead.on_record("g", 0, protocol.Progress(
        job_id="g", rank=0, ts=0, iteration=10, iterations_total=50, loss=1.0, throughput=5,
        samples_per_s=1, fast_forward=False, stages=None))
    assert bodies(report) == [TrainerReport(job_id="g", node_id=N0, event="progress",
                                            iteration=10, loss=1.0, throughput=5)]
    cycle = envelope(CycleStarted(cycle=3, trigger="t"), event_id="x", occurred_at=0,
                     producer="s", causation_id=None)
    assert bodies(lead.handle(cycle, 0.0)) == [NodeStatus(node_id=N0, cycle=3,
                                                          progress={"g": 10.0})]
    assert other.handle(cycle, 0.0) == []
    lead.on_record("g", 0, protocol.Finished(job_id="g", rank=0, ts=0, iteration=50,
                                             loss=0.1, wall_s=1, param_digest="x",
                                             profile=None))
    done = bodies(lead.on_exit("g", 0, 0))
    assert done == [JobFinished(job_id="g", node_id=N0, iterations_done=50.0)]
    assert other.on_exit("g", 1, 0) == []


@pytest.mark.parametrize(("failed", "code"), [(1, 1), (0, -9), (1, -11)])
def test_a_failed_rank_takes_its_gang_down_and_the_leader_names_it(failed: int,
                                                                   code: int) -> None:
    """The ranks left would otherwise wait in the rendezvous or a collective until its
    timeout, holding their GPUs."""
    core = agent(0)
    core.handle(command(N0, 1, (launch("j", ((N0, (0, 1)),)),)), 0.0)  # type: ignore[arg-type]
    other = 1 - failed
    assert core.on_exit("j", failed, code) == [Kill("j", other, 7.0)]
    [done] = bodies(core.on_exit("j", other, -15))  # the kill's own exit names nothing new
    assert done == JobFinished(job_id="j", node_id=N0, iterations_done=0.0,
                               failure=f"rank {failed} exited with {code}")
    assert core.jobs == {}


def test_a_relaunch_here_waits_until_the_stopping_run_has_exited() -> None:
    core = agent(0)
    first = launch("j", ((N0, (0,)),))
    core.handle(command(N0, 1, (first,)), 0.0)  # type: ignore[arg-type]
    again = launch("j", ((N0, (1,)),))
    effects = core.handle(command(N0, 2, (again,), (Stop(job_id="j", reason="move"),)),
                          0.0)  # type: ignore[arg-type]
    assert effects == [Kill("j", 0, 7.0)]  # no spawn while the old run checkpoints
    later = spawns(core.on_exit("j", 0, 0))
    assert [s.gpu_uuids for s in later] == [("GPU-0-b",)]
    assert parse(list(later[0].argv[3:])).master_port == rendezvous_port("j", 2, "/ckpt")


def test_a_model_no_trainer_can_run_is_refused_as_a_permanent_failure() -> None:
    """The launch is refused, not the command: the job beside it starts, and the refused one
    is reported finished with a permanent failure, so the scheduler frees its GPUs at once
    (before, the whole command was dead-lettered and both jobs held GPUs with no process)."""
    core = agent(0)
    bad = launch("x", ((N0, (0,)),), model="xgboost")
    good = launch("y", ((N0, (1,)),))
    effects = core.handle(command(N0, 1, (bad, good)), 0.0)  # type: ignore[arg-type]
    assert [s.job_id for s in spawns(effects)] == ["y"]
    (refused,) = [b for b in bodies(effects) if isinstance(b, JobFinished)]
    assert refused.job_id == "x" and refused.permanent and refused.node_id == N0
    assert refused.failure is not None
    assert "no trainer workload for model 'xgboost'" in refused.failure
    assert "x" not in core.jobs  # nothing held, nothing in its heartbeat


def test_only_the_leader_reports_a_refused_gang() -> None:
    bad = launch("x", ((N1, (0,)), (N0, (0,))), model="xgboost")
    effects = agent(0).handle(command(N0, 1, (bad,)), 0.0)  # type: ignore[arg-type]
    assert effects == []


def test_an_agent_needs_as_many_gpus_as_its_node() -> None:
    with pytest.raises(ValueError, match="should have 2 GPUs; found 1"):
        TrainerNodeCore(CLUSTER.nodes[0], ["GPU-a"], SETTINGS)


def test_subjects() -> None:
    assert [s.subject for s in agent(1).subscriptions()] == [
        subjects.node_command(N1), subjects.CYCLE_STARTED, subjects.NODE_INFO]


def test_a_gang_led_elsewhere_meets_at_the_address_its_leader_announced() -> None:
    core = agent(1)
    info = NodeInfo(node_id=N0, backend="nvml", gpus=(), address="10.0.0.7")
    assert core.handle(envelope(info, event_id="i", occurred_at=0, producer="a",
                                causation_id=None), 0.0) == []
    gang = launch("g", ((N0, (0,)), (N1, (0,))))
    [spawn] = spawns(core.handle(command(N1, 4, (gang,)), 0.0))  # type: ignore[arg-type]
    assert parse(list(spawn.argv[3:])).master_addr == "10.0.0.7"


def test_start_announces_the_inventory_and_heartbeats_carry_telemetry_and_jobs() -> None:
    inventory = NodeInfo(node_id=N0, backend="fake", gpus=(
        GpuInfo(index=0, uuid="GPU-0-a", name="Fake", memory_bytes=1),
        GpuInfo(index=1, uuid="GPU-0-b", name="Fake", memory_bytes=1)),
        links=(GpuLink(a="GPU-0-a", b="GPU-0-b", kind="nvlink"),))
    core = TrainerNodeCore(CLUSTER.nodes[0], ["GPU-0-a", "GPU-0-b"], SETTINGS,
                           inventory=inventory)
    start = core.start(100.0)
    assert bodies(start) == [inventory]
    assert SetTimer("heartbeat", 100.0, PRIORITY_INPUT) in start
    tick = core.on_timer("heartbeat", 100.0)
    assert tick == [SampleGpus(), SetTimer("heartbeat", 100.0 + SETTINGS.heartbeat_s,
                                           PRIORITY_INPUT)]
    core.handle(command(N0, 1, (launch("j", ((N0, (0,)),)),)), 0.0)  # type: ignore[arg-type]
    sample = GpuSample(uuid="GPU-0-a", utilization_ratio=0.5, memory_used_bytes=7)
    assert bodies(core.on_telemetry([sample])) == [
        NodeHeartbeat(node_id=N0, gpus=(sample,), jobs=("j",), interval_s=SETTINGS.heartbeat_s,
                      handled=(0, 1))]


def heartbeat_jobs(core: TrainerNodeCore) -> tuple[str, ...]:
    [hb] = bodies(core.on_telemetry([]))
    assert isinstance(hb, NodeHeartbeat)
    return hb.jobs


def test_a_job_waiting_to_rerun_here_is_listed_and_a_stop_cancels_the_rerun() -> None:
    """The scheduler counts a launched run missing from the heartbeats as vanished: a job
    whose previous run is still checkpointing is about to run, so it is listed."""
    core = agent(0)
    core.handle(command(N0, 1, (launch("j", ((N0, (0,)),)),)), 0.0)  # type: ignore[arg-type]
    core.handle(command(N0, 2, stops=(Stop(job_id="j", reason="preempt"),)),
                0.0)  # type: ignore[arg-type]
    assert heartbeat_jobs(core) == ()  # stopping, for good as far as it knows
    core.handle(command(N0, 3, (launch("j", ((N0, (1,)),)),)), 0.0)  # type: ignore[arg-type]
    assert heartbeat_jobs(core) == ("j",)  # reruns once the old run has exited
    core.handle(command(N0, 4, stops=(Stop(job_id="j", reason="preempt"),)),
                0.0)  # type: ignore[arg-type]
    assert heartbeat_jobs(core) == ()
    assert spawns(core.on_exit("j", 0, 0)) == []  # the rerun was called off


@pytest.mark.parametrize(("colocated", "share"), [((), None), (("j",), None),
                                                  (("j", "k"), 50), (("i", "j", "k"), 33)])
def test_interleaved_jobs_share_their_gpus_through_mps(colocated: tuple[str, ...],
                                                       share: int | None) -> None:
    job = launch("j", ((N0, (0,)),)).model_copy(update={"colocated": colocated})
    [spawn] = spawns(agent(0).handle(command(N0, 1, (job,)), 0.0))  # type: ignore[arg-type]
    assert spawn.mps_percentage == share
