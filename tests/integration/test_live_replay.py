"""A live run exported with `loom log export` replays OK: several jobs, a preemption (SRTF:
a short job takes a long one's GPUs) and a node agent restarted mid-run.

Before, the simplest live run (one job) replayed as DIVERGED at its first launch ("cycle: 2
recorded, 1 replayed"): a scheduler starting on an empty stream ran an empty cycle, which a
replay from the first submission cannot see.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.cli import main
from loom.eventlog import read_log
from loom.serve import ServeOptions, control_subject, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import JobTransition

pytestmark = pytest.mark.nats

CLUSTER = ClusterSpec.uniform(1, 2, 2, gpu_type="fake")
SERVICES = {"scheduler": "scheduler", "placer": "placer", "metrics": "metrics",
            "n0": "nodeagent-n0", "n1": "nodeagent-n1"}


class Stack:
    def __init__(self, url: str) -> None:
        self.url = url
        self.running: dict[str, tuple[asyncio.Task[int], asyncio.Event]] = {}

    def options(self, name: str) -> ServeOptions:
        service = "nodeagent" if name in ("n0", "n1") else name
        return ServeOptions(service, self.url, CLUSTER, node=name, policy="srtf",
                            trainers="simulated", time_scale=200.0)

    async def start(self, name: str, nc: Any) -> None:
        stop = asyncio.Event()
        self.running[name] = (asyncio.create_task(serve(self.options(name), stop)), stop)
        for _ in range(300):
            if SERVICES[name] in await ping(nc, 0.1):
                return
        pytest.fail(f"{name} did not come up")

    async def stop(self, name: str) -> int:
        task, stop = self.running.pop(name)
        stop.set()
        return await task


async def states(nc: Any) -> dict[str, str]:
    reply = await nc.request(control_subject("scheduler"), b"", timeout=5)
    return {j["job_id"]: j["state"] for j in json.loads(reply.data)["jobs"]}


async def submit(job_id: str, gpus: int, iterations: int, url: str) -> None:
    argv = ["submit", "--nats-url", url, "--model", "resnet18", "--gpus", str(gpus),
            "--iterations", str(iterations), "--job-id", job_id]
    assert await asyncio.to_thread(main, argv) == 0


async def test_a_live_run_with_a_preemption_and_an_agent_restart_replays_ok(
        nats_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nc = await nats.connect(nats_server.url)
    stack = Stack(nats_server.url)
    try:
        for name in SERVICES:
            await stack.start(name, nc)
        await submit("long", 4, 40_000, nats_server.url)  # the whole cluster, 200 s of wall
        while (await states(nc)).get("long") != "running":
            await asyncio.sleep(0.05)
        await submit("short", 2, 400, nats_server.url)  # SRTF preempts "long" for it
        await submit("other", 1, 200, nats_server.url)
        assert await stack.stop("n1") == 0  # an agent restarted mid-run
        await stack.start("n1", nc)
        await submit("last", 1, 300, nats_server.url)
        for _ in range(1200):
            seen = await states(nc)
            if all(seen.get(j) == "finished" for j in ("short", "other", "last")):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"jobs did not finish: {seen}")
        info = await nc.jetstream().stream_info(subjects.STREAM)
        assert info.state.messages > 0
    finally:
        for name in list(stack.running):
            await stack.stop(name)
        await nc.close()
    spec = tmp_path / "cluster.json"
    spec.write_text(CLUSTER.model_dump_json())
    log = tmp_path / "live.eventlog.gz"
    export = ["log", "export", "--nats-url", nats_server.url, "--out", str(log),
              "--policy", "srtf", "--cluster", str(spec)]
    assert await asyncio.to_thread(main, export) == 0
    causes = [(t.job_id, t.cause) for t in transitions(log)]
    assert ("long", "preempted") in causes and ("short", "started") in causes
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["replay", str(log)]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.startswith(f"OK {log}")


def transitions(path: Path) -> list[JobTransition]:
    out = []
    for rec in read_log(path).records:
        if rec.subject == subjects.JOB_TRANSITION:
            body = decode(rec.data).body
            assert isinstance(body, JobTransition)
            out.append(body)
    return out
