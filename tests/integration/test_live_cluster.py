"""`loom up` as an operator runs it: separate service processes on an embedded nats-server,
jobs submitted with `loom submit`, watched with `loom status`, stopped with SIGTERM.

Node agents run simulated trainers in time-scaled wall time (200 cluster seconds per second),
so a job of 400 one-second iterations takes two wall seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from loom.serve import ping
from services.runtime.natsserver import free_port
from tests.integration.live_up import LOOM, loom_up
from tests.procfs import alive, children

pytestmark = pytest.mark.nats



PROMETHEUS = free_port()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    with loom_up(tmp_path, "--local-nodes", "2", "--gpus-per-node", "2", "--time-scale", "200",
                 "--trainers", "simulated", "--prometheus-port", str(PROMETHEUS)) as up:
        url = up[1]
        assert (tmp_path / f"loom-{os.getuid()}" / "nats-url").read_text() == url
        yield up


def loom(*args: str) -> str:
    done = subprocess.run([*LOOM, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def status(url: str) -> dict[str, object]:
    state: dict[str, object] = json.loads(loom("status", "--nats-url", url, "--json"))
    return state


def test_jobs_submitted_to_a_live_cluster_run_to_completion(
        cluster: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = cluster
    names = asyncio.run(_ping(url))
    assert names == ["metrics", "nodeagent-n0", "nodeagent-n1", "placer", "scheduler"]
    ids = [loom("submit", "--nats-url", url, "--model", "resnet18", "--gpus", str(g),
                "--iterations", "400", "--tenant", "lab").strip() for g in (2, 2, 4)]
    assert len(set(ids)) == 3 and all(i.startswith("job-") for i in ids)
    asyncio.run(_nats_pub(url, README_JSON))  # what `nats pub` sends: a plain core publish
    too_big = loom("submit", "--nats-url", url, "--model", "bert", "--gpus", "8",
                   "--iterations", "10").strip()
    deadline = time.monotonic() + 60
    while True:
        jobs = {j["job_id"]: j for j in status(url)["jobs"]}  # type: ignore[attr-defined]
        if all(jobs.get(i, {}).get("state") == "finished" for i in ids):
            break
        assert time.monotonic() < deadline, jobs
        time.sleep(0.5)
    assert all(jobs[i]["done"] == 400 and jobs[i]["tenant"] == "lab" for i in ids)
    by_hand = [j for j in jobs.values() if j["tenant"] == "nlp"]
    assert len(by_hand) == 1 and by_hand[0]["model"] == "bert"  # admitted under a new id
    assert jobs[too_big]["state"] == "rejected"
    assert jobs[too_big]["reason"] == "needs 8 GPUs; the cluster has 4"
    with urllib.request.urlopen(f"http://127.0.0.1:{PROMETHEUS}/metrics", timeout=5) as resp:
        scrape = resp.read().decode()
    # The three, and the README's job if it has finished by now too (a loaded machine).
    after = sum(j["state"] == "finished" for j in status(url)["jobs"])  # type: ignore[index]
    finished = re.search(r'loom_jobs\{state="finished"\} (\d+)\.0', scrape)
    assert finished is not None and 3 <= int(finished[1]) <= after, scrape
    assert f"loom_job_completion_seconds_count {finished[1]}.0" in scrape
    table = loom("status", "--nats-url", url)
    assert "finished" in table and ids[2] in table
    operate(url)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # every service drained cleanly


def operate(url: str) -> None:
    """Operators' commands through the CLI, each confirmed from the scheduler's state."""
    long = loom("submit", "--nats-url", url, "--model", "vgg16", "--gpus", "1",
                "--iterations", "10000000").strip()
    assert loom("suspend", long, "--nats-url", url).strip() == f"suspend {long}: done"
    state = status(url)
    assert state["suspended"] == [long]
    row = next(j for j in state["jobs"] if j["job_id"] == long)  # type: ignore[attr-defined]
    assert row["reason"] == "suspended by an operator"
    assert loom("resume", long, "--nats-url", url).strip() == f"resume {long}: done"
    assert loom("drain", "n0", "--nats-url", url).strip() == "drain n0: done"
    assert status(url)["drained"] == ["n0"]
    assert loom("drain", "n0", "--undo", "--nats-url", url).strip() == "undrain n0: done"
    assert loom("set-policy", "srtf", "--nats-url", url).strip() == "set-policy srtf: done"
    assert status(url)["policy"] == "srtf"
    assert loom("cancel", long, "--nats-url", url).strip() == f"cancel {long}: done"
    bad = subprocess.run([*LOOM, "cancel", long, "--nats-url", url], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and f"cancel: no active job '{long}'" in bad.stderr


# The README's `nats pub loom.jobs.submit '...'` payload, byte for byte.
README_JSON = (b'{"model": "bert", "gpus": 2, "iterations": 5000, "iteration_time_s": 0.5, '
               b'"tenant": "nlp"}')


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_a_killed_loom_up_takes_its_services_and_nats_server_with_it(
        cluster: tuple[subprocess.Popen[str], str]) -> None:
    """SIGKILL leaves `loom up` no chance to stop its children; they must not run on."""
    proc, _ = cluster
    kids = children(proc.pid)
    assert len(kids) >= 6  # nats-server, scheduler, placer, metrics, two node agents
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while (running := [k for k in kids if alive(k)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running == [], f"still running after their parent was killed: {running}"


def test_the_readme_shows_exactly_these_bytes() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"nats pub loom.jobs.submit '{README_JSON.decode()}'" in readme


async def _nats_pub(url: str, payload: bytes) -> None:
    nc = await nats.connect(url)
    try:
        await nc.publish("loom.jobs.submit", payload)
        await nc.flush()
    finally:
        await nc.close()


async def _ping(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return await ping(nc)
    finally:
        await nc.close()


def test_serve_refuses_a_node_agent_without_its_node() -> None:
    done = subprocess.run([*LOOM, "serve", "nodeagent", "--cluster", "n8g8", "--nats-url",
                           "nats://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "nodeagent needs --node" in done.stderr
