"""The node agent's shell: MPS for interleaved jobs, the rank-0 checkpoint lock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from schemas.cluster import ClusterSpec
from services.nodeagent.agent import Spawn, TrainerNodeCore, TrainerSettings
from services.nodeagent.gpu import FakeBackend
from services.nodeagent.live import LOCK_NAME, NodeAgentShell, _lock
from services.nodeagent.supervisor import ProcessSpec
from services.runtime.bus import BusStats
from services.runtime.clock import WallClock


class NullBus:
    stats = BusStats()

    async def publish(self, subject: str, env: object) -> bool:
        return True

    async def flush(self) -> None:
        return None


def shell(tmp_path: Path) -> tuple[NodeAgentShell, FakeBackend, list[ProcessSpec]]:
    node = ClusterSpec.uniform(1, 1, 2).nodes[0]
    fake = FakeBackend(2, node=node.node_id)
    settings = TrainerSettings(checkpoint_root=tmp_path / "ckpt", mps_dir=tmp_path / "mps")
    core = TrainerNodeCore(node, [fake.uuid(0), fake.uuid(1)], settings)
    sh = NodeAgentShell(core, NullBus(), WallClock(), run_id="t",  # type: ignore[arg-type]
                        backend=fake)
    launched: list[ProcessSpec] = []

    async def launch(spec: ProcessSpec) -> int:
        launched.append(spec)
        return 1

    sh.supervisor.launch = launch  # type: ignore[method-assign]
    return sh, fake, launched


async def test_an_interleaved_job_starts_the_mps_daemon_and_gets_its_share(
        tmp_path: Path) -> None:
    sh, fake, launched = shell(tmp_path)
    ckpt = str(tmp_path / "ckpt" / "j")
    await sh._spawn(Spawn("j", 1, ("true",), (fake.uuid(0),), ckpt, mps_percentage=50))
    await sh._spawn(Spawn("k", 1, ("true",), (fake.uuid(0),), ckpt, mps_percentage=50))
    starts = [c for c in fake.commands if c[-1] == "-d"]
    assert len(starts) == 1  # one daemon for the node
    env = launched[0].env
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith(str(tmp_path / "mps"))
    await sh.stop()
    assert fake.commands[-2][-1] == "quit" and fake.commands[-1] == ("close",)


async def test_a_job_alone_runs_without_mps(tmp_path: Path) -> None:
    sh, fake, launched = shell(tmp_path)
    await sh._spawn(Spawn("j", 1, ("true",), (fake.uuid(0),), str(tmp_path / "c")))
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in launched[0].env
    assert not any("nvidia-cuda-mps-control" in c for c in fake.commands)


async def test_rank0_waits_for_the_previous_run_to_let_go_of_the_checkpoint(
        tmp_path: Path) -> None:
    held = await _lock(tmp_path, wait_s=1.0)  # the previous run's rank 0 (any process)
    waiting = asyncio.create_task(_lock(tmp_path, wait_s=5.0))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    held.close()  # it exited: the lock goes with its file
    (await asyncio.wait_for(waiting, 2.0)).close()
    assert (tmp_path / LOCK_NAME).exists()


async def test_a_lock_never_released_is_a_clear_timeout(tmp_path: Path) -> None:
    held = await _lock(tmp_path, wait_s=1.0)
    with pytest.raises(TimeoutError, match="previous run has not exited"):
        await _lock(tmp_path, wait_s=0.2)
    held.close()
