"""`loom queues` against a live cluster: a real nats-server, the scheduler run with a tenants
file defining a cohort of two queues, a placer, simulated node agents and the metrics service
with its Prometheus endpoint. Jobs are submitted with `loom submit`; `loom queues` (the CLI,
in-process) and the `loom_queue_*` series show who holds, borrows and lends what."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.cli import main
from loom.serve import ServeOptions, ping, serve
from schemas.cluster import ClusterSpec
from schemas.tenants import TenantsConfig, load_tenants
from services.runtime.natsserver import EmbeddedNats, free_port

pytestmark = pytest.mark.nats

CLUSTER = ClusterSpec.uniform(1, 2, 4, gpu_type="fake")  # 8 GPUs
TENANTS = """
[cohorts.research]

[queues.lang]
cohort = "research"
tenants = ["nlp"]
nominal = 4
borrowing_limit = 2

[queues.vision]
cohort = "research"
tenants = ["cv"]
nominal = 4
weight = 2
"""
NAMES = {"scheduler": "scheduler", "placer": "placer", "metrics": "metrics",
         "n0": "nodeagent-n0", "n1": "nodeagent-n1"}


class Stack:
    def __init__(self, url: str, tenants: TenantsConfig | None, prometheus: int) -> None:
        self.url, self.tenants, self.prometheus = url, tenants, prometheus
        self.running: list[tuple[asyncio.Task[int], asyncio.Event]] = []

    async def start(self, nc: Any, *names: str) -> None:
        for name in names:
            service = "nodeagent" if name.startswith("n") else name
            opts = ServeOptions(service, self.url, CLUSTER, node=name, trainers="simulated",
                                tenants=self.tenants, prometheus_port=self.prometheus)
            stop = asyncio.Event()
            self.running.append((asyncio.create_task(serve(opts, stop)), stop))
        for _ in range(600):
            if sorted(NAMES[n] for n in names) == await ping(nc, 0.1):
                return
        pytest.fail(f"{names} did not come up")

    async def stop(self) -> None:
        for _, stop in self.running:
            stop.set()
        for task, _ in self.running:
            assert await task == 0


async def loom(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = await asyncio.to_thread(main, list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


async def submit(url: str, job_id: str, tenant: str, gpus: int) -> None:
    argv = ["submit", "--nats-url", url, "--model", "resnet18", "--gpus", str(gpus),
            "--iterations", "1000000", "--tenant", tenant, "--job-id", job_id]
    assert await asyncio.to_thread(main, argv) == 0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


async def test_loom_queues_shows_borrowing_lending_and_why_jobs_wait(
        nats_server: EmbeddedNats, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "tenants.toml"
    file.write_text(TENANTS)
    port = free_port()
    url = nats_server.url
    stack = Stack(url, load_tenants(file), port)
    nc = await nats.connect(url)
    try:
        await stack.start(nc, *NAMES)
        # lang: 3 jobs of 2 GPUs run (6: its 4 + 2 borrowed, its limit), the 4th waits;
        # vision: one job of 1 GPU runs, within its quota.
        for i in range(4):
            await submit(url, f"lang-{i}", "nlp", 2)
        await submit(url, "vision-0", "cv", 1)
        for _ in range(300):
            rc, out, err = await loom(capsys, "queues", "--nats-url", url, "--json")
            assert rc == 0, err
            status = json.loads(out)
            rows = {q["name"]: q for q in status["queues"]}
            # vision-0 was submitted last: once it runs, a cycle has seen every job
            if (rows["lang"]["running_jobs"], rows["lang"]["pending_jobs"],
                    rows["vision"]["running_jobs"]) == (3, 1, 1):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the jobs never showed: {status}")
        assert [c["name"] for c in status["cohorts"]] == ["research"]
        lang, vision = rows["lang"], rows["vision"]
        assert lang["quotas"] == [{"gpu_type": "*", "nominal": 4, "borrowing_limit": 2,
                                   "lending_limit": None, "used": 6, "borrowed": 2, "lent": 0}]
        assert (lang["running_jobs"], lang["pending_jobs"], lang["pending_gpus"]) == (3, 1, 2)
        assert [(w["code"], w["jobs"], w["job_id"]) for w in lang["waiting"]] == [
            ("borrowing_limit", 1, "lang-3")]
        assert lang["waiting"][0]["reason"] == (
            "queue 'lang' would hold 8 GPUs, over its nominal 4 + borrowing limit 2")
        assert vision["quotas"][0]["used"] == 1 and vision["quotas"][0]["lent"] == 2
        assert vision["waiting"] == [] and vision["rank"] == 1 and lang["rank"] == 2

        rc, table, err = await loom(capsys, "queues", "--nats-url", url)
        assert rc == 0, err
        assert "cohort research" in table and "8 GPUs nominal · 7 used · 2 borrowed" in table
        assert "lang: borrowing_limit (1 job; first lang-3): queue 'lang' would hold 8" in table

        want = ('loom_queue_used_gpus{cohort="research",gpu_type="",queue="lang"} 6.0',
                'loom_queue_lent_gpus{cohort="research",gpu_type="",queue="vision"} 2.0',
                'loom_queue_pending_jobs{cohort="research",queue="lang"} 1.0')
        for _ in range(300):  # the metrics service hears the status through the stream
            text = await asyncio.to_thread(scrape, port)
            if all(line in text for line in want):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"missing {[w for w in want if w not in text]} in\n{text}")
    finally:
        await stack.stop()
        await nc.close()


async def test_without_queues_loom_queues_says_so(
        nats_server: EmbeddedNats, capsys: pytest.CaptureFixture[str]) -> None:
    url = nats_server.url
    rc, _, err = await loom(capsys, "queues", "--nats-url", url)
    assert (rc, err.strip()) == (2, "error: no scheduler is running on this NATS server")
    stack = Stack(url, None, free_port())
    nc = await nats.connect(url)
    try:
        await stack.start(nc, "scheduler")
        rc, out, _ = await loom(capsys, "queues", "--nats-url", url)
        assert rc == 0
        assert out.startswith("No queues are configured: the scheduler runs without a tenants "
                              "file")
        rc, out, _ = await loom(capsys, "queues", "--nats-url", url, "--json")
        assert rc == 0
        assert {k: json.loads(out)[k] for k in ("tenants_file", "queues")} == {
            "tenants_file": False, "queues": []}
    finally:
        await stack.stop()
        await nc.close()
