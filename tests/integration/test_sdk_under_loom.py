"""A user's own script under Loom: the SDK example and a plain command job on a live cluster.

Real everything except the GPUs: an embedded nats-server, every service in its own process,
one node agent with two fake GPUs launching the commands the jobs name. The SDK example
(examples/train_mnist_like.py) is elastic (1 or 2 GPUs) under ElasticFlow; a plain script
that prints `LOOM_PROGRESS` lines holds the other GPU until the test lets it end. The example
is suspended (SIGTERM, checkpoint, exit 0), resumed at one rank, and, once the plain job has
finished, resized by the scheduler to two ranks; it must end at exactly its iteration count
with a loss that never starts over.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.live_cli import _operate
from loom.serve import control_subject
from loom.up import UpOptions, up
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import PlanDecided, TrainerReport, gpu_count
from services.runtime.bus import MSG_ID
from services.runtime.nats_live import ensure_stream
from tests.integration.live_up import GATED_SCRIPT

pytest.importorskip("torch")
pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_mnist_like.py"
# The example's iterations and global batch. After its resume at one rank it must outlast the
# scheduler's resize (plain job's exit, a 2 s cycle, checkpoint, two new ranks: ~8 s here), or
# there is nothing left to resize: a batch of 512 makes an iteration ~25 ms even on a quiet
# machine (a batch of 32 and 2,000 iterations finished first in CI).
TOTAL = 1000
BATCH = 512
PLAIN = 25  # the plain job's iterations



class Watch:
    def __init__(self) -> None:
        self.reports: dict[str, list[TrainerReport]] = {}
        self.widths: dict[str, list[int]] = {}  # GPUs of each launch, from the scheduler's plans
        self.changed = asyncio.Event()
        self.timeline: list[str] = []

    async def on_plan(self, msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, PlanDecided):
            for launch in body.launches:
                self.widths.setdefault(launch.job_id, []).append(gpu_count(launch.placement))

    async def on_report(self, msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, TrainerReport):
            self.reports.setdefault(body.job_id, []).append(body)
            self.changed.set()

    async def until(self, job: str, what: str, pred: Callable[[TrainerReport], bool],
                    wait_s: float = 300.0, skip: int = 0) -> TrainerReport:
        """The first report of `job` (after the first `skip`) that `pred` accepts; a timeout
        names the step and the job's reports so far."""
        async def look() -> TrainerReport:
            while True:
                for r in self.reports.get(job, [])[skip:]:
                    if pred(r):
                        return r
                self.changed.clear()
                await self.changed.wait()
        t0 = time.monotonic()
        try:
            found = await asyncio.wait_for(look(), wait_s)
        except TimeoutError:
            trail = [(r.event, r.iteration) for r in self.reports.get(job, [])]
            raise AssertionError(f"{job}: no report {what!r} in {wait_s:g} s; "
                                 f"widths {self.widths.get(job)}, reports {trail}") from None
        self.timeline.append(f"{job} {what} after {time.monotonic() - t0:.1f} s")
        return found


async def _job_row(nc: Any, job: str) -> dict[str, Any]:
    state = json.loads((await nc.request(control_subject("scheduler"), b"", timeout=10)).data)
    rows: dict[str, dict[str, Any]] = {j["job_id"]: j for j in state["jobs"]}
    return rows[job]


async def _scenario(url: str, gate: Path) -> dict[str, Any]:
    nc = await nats.connect(url)
    watch = Watch()
    await nc.subscribe(subjects.JOB_PROGRESS, cb=watch.on_report)
    await nc.subscribe(subjects.PLAN_DECIDED, cb=watch.on_plan)
    js = nc.jetstream()
    await ensure_stream(js)

    async def submit(body: dict[str, Any]) -> None:
        await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                         headers={MSG_ID: f"submit.{body['job_id']}"})

    await submit({"job_id": "plain", "model": "script", "gpus": 1, "iterations": PLAIN,
                  "iteration_time_s": 0.05, "command": [sys.executable, "-c", GATED_SCRIPT],
                  "env": {"GATE": str(gate)}})
    await watch.until("plain", "iteration 3", lambda r: r.iteration >= 3)
    # An unmodified job is stopped (SIGTERM) and restarted: it runs its command again.
    await _operate(url, "suspend", "plain", None, None)
    for _ in range(100):
        if (await _job_row(nc, "plain"))["state"] == "preempted":
            break
        await asyncio.sleep(0.1)
    first_run = len(watch.reports["plain"])
    await _operate(url, "resume", "plain", None, None)
    await watch.until("plain", "restarted at 1", lambda r: r.iteration == 1,
                      skip=first_run)
    await submit({"job_id": "sdk", "model": "mnist-like", "gpus": 1, "min_gpus": 1,
                  "max_gpus": 2, "scaling": {"1": 1.0, "2": 1.9}, "iterations": TOTAL,
                  "batch_size": BATCH, "iteration_time_s": 0.025,
                  "command": [sys.executable, str(EXAMPLE)], "cwd": str(ROOT),
                  "env": {"PYTHONPATH": str(ROOT)}})
    await watch.until("sdk", "iteration 40",
                      lambda r: r.event == "progress" and r.iteration >= 40)

    await _operate(url, "suspend", "sdk", None, None)  # preemption: SIGTERM, checkpoint
    stop1 = await watch.until("sdk", "stopped", lambda r: r.event == "stopped")
    await _operate(url, "resume", "sdk", None, None)
    await watch.until("sdk", "resumed", lambda r: r.event == "started" and r.resumed)

    gate.touch()  # the plain job ends; ElasticFlow gives its GPU to the elastic job
    await watch.until("plain", "last iteration", lambda r: r.iteration >= PLAIN)
    await watch.until("sdk", "resized", lambda r: r.event == "started" and r.resumed
                      and r.iteration > stop1.iteration)
    await watch.until("sdk", "finished", lambda r: r.event == "finished", wait_s=300)
    for _ in range(300):
        rows = [await _job_row(nc, j) for j in ("plain", "sdk")]
        if all(r["state"] == "finished" for r in rows):
            break
        await asyncio.sleep(0.2)
    await nc.close()
    print("\n".join(watch.timeline))
    return {"reports": watch.reports, "widths": watch.widths["sdk"], "rows": rows}


def _runs(reports: list[TrainerReport]) -> list[list[TrainerReport]]:
    """The reports split at each start: one list per launch."""
    runs: list[list[TrainerReport]] = []
    for r in reports:
        if r.event == "started" or not runs:
            runs.append([])
        runs[-1].append(r)
    return runs


def test_sdk_example_and_a_plain_command_under_loom(tmp_path: Path) -> None:
    cluster = ClusterSpec.uniform(1, 1, 2, gpu_type="fake", name="sdk")
    spec = tmp_path / "cluster.json"
    spec.write_text(cluster.model_dump_json())
    opts = UpOptions(cluster, str(spec), policy="elasticflow", round_s=2.0, trainers="pytorch",
                     gpus_per_node=2, state_dir=tmp_path)

    async def main() -> dict[str, Any]:
        ready, stop = asyncio.Event(), asyncio.Event()
        url: list[str] = []
        task = asyncio.create_task(up(opts, ready=ready, stop=stop, url_out=url))
        try:
            await asyncio.wait_for(ready.wait(), 300)
            return await _scenario(url[0], tmp_path / "gate")
        finally:
            stop.set()
            await task

    out = asyncio.run(main())
    sdk, plain = out["reports"]["sdk"], out["reports"]["plain"]
    trail = [(r.event, r.iteration) for r in sdk]
    assert [r["state"] for r in out["rows"]] == ["finished", "finished"], (out["rows"], trail)
    assert out["rows"][1]["done"] == TOTAL and out["rows"][0]["done"] == PLAIN

    # The plain job: its printed count, to the last line, run twice (it cannot resume).
    # Where the second run starts (its count begins again at 1): the first run's last reports
    # may still arrive after the scheduler shows the job preempted.
    counts = [r.iteration for r in plain]
    k = counts.index(1, 1)
    assert k >= 3 and counts == [*range(1, k + 1), *range(1, PLAIN + 1)]

    # The SDK job: one GPU, suspended, resumed at one, resized to two by the scheduler.
    assert out["widths"] == [1, 1, 2]
    runs = _runs(sdk)
    assert len(runs) == 3, [(r.event, r.iteration) for r in sdk]
    ends = [run[-1] for run in runs]
    assert [e.event for e in ends] == ["stopped", "stopped", "finished"]
    assert ends[-1].iteration == TOTAL  # exactly its iteration count
    for before, after in itertools.pairwise(runs):
        start = after[0]
        assert start.resumed and start.iteration == before[-1].iteration  # from the checkpoint
        last_loss = [r.loss for r in before if r.loss is not None][-1]
        next_loss = next(r.loss for r in after if r.loss is not None)
        # Continuous: a restart from scratch would be back at ~2.3 (ln 10).
        assert abs(next_loss - last_loss) < 0.35 * last_loss + 0.05, (last_loss, next_loss)
        assert next_loss < 2.0
