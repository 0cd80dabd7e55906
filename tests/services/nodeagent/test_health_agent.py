"""The node agent runs the doctor: every check at start-up, the cheap ones with every
heartbeat (whose report then carries what fails), the others again in the background; a
fault the fake backend injects shows in the next heartbeat and leaves it when it is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.events import Envelope, HealthProblem, NodeHealth, NodeHeartbeat
from services.nodeagent.agent import SampleGpus, TrainerNodeCore, TrainerSettings
from services.nodeagent.gpu import FakeBackend, FakeFaults
from services.nodeagent.live import NodeAgentShell
from services.runtime.bus import BusStats
from services.runtime.clock import WallClock


class RecordingBus:
    stats = BusStats()

    def __init__(self) -> None:
        self.published: list[tuple[str, Envelope]] = []

    async def publish(self, subject: str, env: Envelope) -> bool:
        self.published.append((subject, env))
        return True

    async def subscribe(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def flush(self) -> None:
        return None


def agent(tmp_path: Path, faults: str = "", health_checks: bool = True
          ) -> tuple[NodeAgentShell, FakeBackend, RecordingBus]:
    node = ClusterSpec.uniform(1, 1, 2).nodes[0]
    fake = FakeBackend(2, node=node.node_id, faults=FakeFaults.parse(faults))
    settings = TrainerSettings(checkpoint_root=tmp_path / "ckpt", mps_dir=tmp_path / "mps")
    core = TrainerNodeCore(node, [fake.uuid(0), fake.uuid(1)], settings)
    bus = RecordingBus()
    sh = NodeAgentShell(core, bus, WallClock(), run_id="t",  # type: ignore[arg-type]
                        backend=fake, health_checks=health_checks)
    return sh, fake, bus


async def heartbeat(sh: NodeAgentShell, bus: RecordingBus) -> NodeHeartbeat:
    await sh.apply([SampleGpus()], None)
    subject, env = bus.published[-1]
    assert subject == subjects.node_subject(sh.core.node.node_id, subjects.HEARTBEAT)
    assert isinstance(env.body, NodeHeartbeat)
    return env.body


def failing(health: NodeHealth | None) -> set[tuple[str, int | None]]:
    assert health is not None
    return {(p.check, p.gpu) for p in health.problems if p.status == "fail"}


async def test_a_healthy_node_reports_no_problems_and_keeps_its_mps_daemon(
        tmp_path: Path) -> None:
    sh, fake, bus = agent(tmp_path)
    await sh.start()
    assert sh.monitor is not None and {c.status for c in sh.monitor.latest} == {"pass", "skip"}
    assert [c[-1] for c in fake.commands if c[0] == "env"] == ["-d"]  # started, kept
    beat = await heartbeat(sh, bus)
    assert beat.health == NodeHealth()
    await sh.stop()
    assert [c[-1] for c in fake.commands if c[0] == "env"] == ["-d", "quit"]


async def test_a_heartbeat_timer_firing_after_stop_leaves_the_closed_backend_alone(
        tmp_path: Path) -> None:
    sh, fake, bus = agent(tmp_path)
    await sh.start()
    await heartbeat(sh, bus)
    await sh.stop()
    published = len(bus.published)
    assert fake.closed
    await sh.apply([SampleGpus()], None)
    assert fake.commands[-1] == ("close",) and len(bus.published) == published


async def test_a_fault_shows_in_the_next_heartbeat_and_leaves_when_it_is_gone(
        tmp_path: Path) -> None:
    sh, fake, bus = agent(tmp_path)
    await sh.start()
    fake.faults = FakeFaults.parse("ecc_uncorrectable=1,xid=0:13")
    beat = await heartbeat(sh, bus)
    assert failing(beat.health) == {("ecc", 1)}
    assert beat.health is not None
    assert HealthProblem(check="xid", status="warn", gpu=0,
                         detail="GPU 0: XID 13 (graphics engine exception)") in beat.health.problems
    fake.faults = FakeFaults.parse("checkpoint_readonly")
    assert failing((await heartbeat(sh, bus)).health) == {("checkpoint", None)}
    fake.faults = FakeFaults()
    assert (await heartbeat(sh, bus)).health == NodeHealth()
    await sh.stop()


async def test_a_start_up_failure_stays_in_every_heartbeat_until_a_refresh_passes(
        tmp_path: Path) -> None:
    sh, fake, bus = agent(tmp_path, "no_gloo,mps")
    await sh.start()
    assert failing((await heartbeat(sh, bus)).health) == {("gloo", None), ("mps", None)}
    assert failing((await heartbeat(sh, bus)).health) == {("gloo", None), ("mps", None)}
    fake.faults = FakeFaults()  # fixed: the next refresh finds it so
    assert sh.monitor is not None
    sh.monitor.refresh_s = 1e-6
    await heartbeat(sh, bus)  # starts the refresh in the background
    for _ in range(100):
        if sh.monitor._refreshing is None:
            break
        await asyncio.sleep(0.01)
    sh.monitor.refresh_s = 1e9
    assert (await heartbeat(sh, bus)).health == NodeHealth()
    await sh.stop()


async def test_nvml_lost_while_running_fails_the_driver_check(tmp_path: Path) -> None:
    sh, fake, bus = agent(tmp_path)
    await sh.start()
    fake.faults = FakeFaults.parse("no_nvml")
    beat = await heartbeat(sh, bus)
    assert failing(beat.health) == {("driver", None)} and beat.gpus == ()
    await sh.stop()


async def test_without_health_checks_heartbeats_carry_no_report(tmp_path: Path) -> None:
    sh, fake, bus = agent(tmp_path, "ecc_uncorrectable=0", health_checks=False)
    await sh.start()
    assert sh.monitor is None and (await heartbeat(sh, bus)).health is None
    assert not [c for c in fake.commands if c[0] in ("env", "health")]
    await sh.stop()
