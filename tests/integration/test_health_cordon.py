"""Health cordoning end to end: real nats-server, `loom serve` processes, fake GPUs with
injected faults (`--fake-faults`).

Node n0's GPU 0 has had XID 79 (fallen off the bus); node n1's checkpoint directory cannot be
written. Each agent's doctor finds it at start-up and its heartbeats say so; the scheduler
takes n0's GPU 0 out of service alone and cordons n1, with the reasons in its state (what
`loom status` shows). A one-GPU job then runs on n0's GPU 1. n1's agent restarted without the
fault is uncordoned at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.serve import control_subject, ping
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import JobTransition
from schemas.job import JobState
from services.runtime.natsserver import EmbeddedNats

pytestmark = pytest.mark.nats

LOOM = [sys.executable, "-m", "loom.cli", "serve"]
WAIT_S = 120.0


class Live:
    def __init__(self, url: str, spec: Path, root: Path) -> None:
        self.url, self.spec, self.root = url, spec, root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, service: str, *extra: str) -> None:
        self.procs[name] = subprocess.Popen([*LOOM, service, "--nats-url", self.url,
                                             "--cluster", str(self.spec), "--log-level",
                                             "warning", *extra])

    def agent(self, node: str, faults: str) -> None:
        self.start(node, "nodeagent", "--node", node, "--fake-gpus", "2", "--fake-faults",
                   faults, "--checkpoint-root", str(self.root / node / "ckpt"),
                   "--heartbeat-s", "0.5")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


@pytest.fixture
def live(tmp_path: Path, nats_server: EmbeddedNats) -> Iterator[Live]:
    spec = tmp_path / "cluster.json"
    spec.write_text(ClusterSpec.uniform(1, 2, 2, gpu_type="fake", name="health")
                    .model_dump_json())
    cluster = Live(nats_server.url, spec, tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop_all()


async def until(what: str, check: Callable[[], Any]) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        found = await check()
        if found:
            return found
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def test_failing_checks_cordon_a_node_and_take_a_gpu_out_alone(live: Live) -> None:
    nc = await nats.connect(live.url)
    transitions: list[JobTransition] = []

    async def on(msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, JobTransition):
            transitions.append(body)

    async def state() -> dict[str, Any]:
        reply = await nc.request(control_subject("scheduler"), b"", timeout=5)
        data: dict[str, Any] = json.loads(reply.data)
        return data

    try:
        await nc.subscribe("loom.jobs.transition", cb=on)
        live.start("scheduler", "scheduler", "--policy", "fifo")
        live.start("placer", "placer")
        live.agent("n0", "xid=0:79")
        live.agent("n1", "checkpoint_readonly")
        want = ["nodeagent-n0", "nodeagent-n1", "placer", "scheduler"]
        deadline = asyncio.get_running_loop().time() + 60
        while (names := await ping(nc)) != want:
            assert asyncio.get_running_loop().time() < deadline, names

        async def both_seen() -> dict[str, Any] | None:
            s = await state()
            return s if s["gpus_out"] and s["cordoned"] else None

        s = await until("n0's GPU 0 out and n1 cordoned", both_seen)
        assert list(s["gpus_out"]) == ["n0"] and list(s["gpus_out"]["n0"]) == ["0"]
        assert "XID 79" in s["gpus_out"]["n0"]["0"]
        assert list(s["cordoned"]) == ["n1"] and "checkpoint" in s["cordoned"]["n1"]["health"]
        assert s["drained"] == []  # no operator drained anything

        job = {"job_id": "h1", "model": "cnn", "gpus": 1, "iterations": 100000,
               "iteration_time_s": 0.05, "batch_size": 8}
        await nc.jetstream().publish("loom.jobs.submit", json.dumps(job).encode())

        async def running() -> JobTransition | None:
            return next((t for t in transitions
                         if t.job_id == "h1" and t.state is JobState.RUNNING), None)

        started = await until("the job to start", running)
        assert started.placement == (("n0", (1,)),)  # the healthy GPU of the healthy node

        live.stop("n1")
        live.agent("n1", "")  # fixed: its next heartbeat lifts the cordon

        async def uncordoned() -> bool:
            return not (await state())["cordoned"]

        await until("n1 uncordoned", uncordoned)
    finally:
        await nc.close()
