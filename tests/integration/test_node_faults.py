"""Node faults on a live cluster: real nats-server, `loom serve` processes, PyTorch trainers.

Two nodes of one fake GPU each. A node agent is killed with SIGKILL while its job trains: the
scheduler marks the node lost, requeues the job, and it resumes from its periodic checkpoint
on the other node and finishes. The killed agent is started again. Then an agent is frozen
(SIGSTOP, a partition) while its job trains: the job is requeued onto the other node; when
the agent thaws it still runs the job, and is told to stop it, so the job finishes once.
Last, a job whose checkpoint is corrupt: its trainer exits non-zero at every start, is
retried once after a backoff, then the job fails with the trainer's reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.serve import control_subject, ping
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import DeadLetter, JobTransition, NodeCommand, TrainerReport
from schemas.job import JobState
from services.runtime.natsserver import EmbeddedNats
from tests.procfs import alive, children

pytestmark = pytest.mark.nats

LOOM = [sys.executable, "-m", "loom.cli", "serve"]
HEARTBEAT_S = 0.5
MISSES = 10  # lost after 5 s without a heartbeat: generous on a busy machine
WAIT_S = 240.0


@dataclass
class Watch:
    """What the cluster said, from core subscriptions to the subjects of interest."""

    transitions: list[JobTransition] = field(default_factory=list)
    reports: list[TrainerReport] = field(default_factory=list)
    commands: list[NodeCommand] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    async def on(self, msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, DeadLetter):
            self.dead.append(body)
        if isinstance(body, JobTransition):
            self.transitions.append(body)
        elif isinstance(body, TrainerReport):
            self.reports.append(body)
        elif isinstance(body, NodeCommand):
            self.commands.append(body)

    def of(self, job: str) -> list[JobTransition]:
        return [t for t in self.transitions if t.job_id == job]


@dataclass
class Cluster:
    url: str
    spec: Path
    ckpt: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, service: str, *extra: str, name: str | None = None) -> None:
        common = ["--nats-url", self.url, "--cluster", str(self.spec), "--log-level", "warning"]
        self.procs[name or service] = subprocess.Popen([*LOOM, service, *common, *extra])

    def agent(self, node: str) -> None:
        self.start("nodeagent", "--node", node, "--fake-gpus", "1", "--checkpoint-root",
                   str(self.ckpt), "--heartbeat-s", str(HEARTBEAT_S), "--checkpoint-every",
                   "10", "--grace-s", "20", name=node)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def live(tmp_path: Path, nats_server: EmbeddedNats) -> Iterator[Cluster]:
    spec = tmp_path / "cluster.json"
    spec.write_text(ClusterSpec.uniform(1, 2, 1, gpu_type="fake", name="faults")
                    .model_dump_json())
    cluster = Cluster(nats_server.url, spec, tmp_path / "ckpt")
    try:
        yield cluster
    finally:
        cluster.stop_all()


def trainers_of(job: str, parent: int) -> set[int]:
    """PIDs of the job's trainer processes that `parent` (a node agent) started."""
    found = set()
    needle = f"LOOM_JOB_ID={job}".encode()
    for pid in children(parent):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ:
            found.add(pid)
    return found


async def until(what: str, check: Any, watch: Watch) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        found = check()
        if found:
            return found
        if loop.time() > deadline:
            seen = [(t.job_id, t.state.value, t.cause) for t in watch.transitions]
            raise AssertionError(f"timed out waiting for {what}; transitions: {seen}")
        await asyncio.sleep(0.1)


def submit(job: str, iterations: int) -> bytes:
    return json.dumps({"job_id": job, "model": "cnn", "gpus": 1, "iterations": iterations,
                       "iteration_time_s": 0.05, "batch_size": 8}).encode()


async def test_jobs_survive_a_killed_and_a_partitioned_node_agent(live: Cluster) -> None:
    watch = Watch()
    nc = await nats.connect(live.url)
    try:
        for subject in ("loom.jobs.transition", "loom.node.*.progress", "loom.node.*.command",
                        "loom.deadletter.>"):
            await nc.subscribe(subject, cb=watch.on)
        live.start("scheduler", "--policy", "fifo", "--node-misses", str(MISSES),
                   "--retry-attempts", "2", "--retry-base-s", "0.5")
        live.start("placer")
        live.agent("n0")
        live.agent("n1")
        want = ["nodeagent-n0", "nodeagent-n1", "placer", "scheduler"]
        deadline = asyncio.get_running_loop().time() + 60
        while (names := await ping(nc)) != want:
            assert asyncio.get_running_loop().time() < deadline, names
        await killed_agent(nc, live, watch)
        await partitioned_agent(nc, live, watch)
        await failing_trainer(nc, live, watch)
        finished = [t.job_id for t in watch.transitions if t.state is JobState.FINISHED]
        assert sorted(finished) == sorted(set(finished))  # every job finished exactly once
        # Nothing refused on the way, a double booking by the placer least of all.
        assert watch.dead == []
    finally:
        await nc.close()


async def killed_agent(nc: Any, live: Cluster, watch: Watch) -> None:
    job = f"nf-{secrets.token_hex(3)}-kill"
    await nc.publish("loom.jobs.submit", submit(job, 150))
    (first,) = await until("the job to start", lambda: [
        t for t in watch.of(job) if t.state is JobState.RUNNING], watch)
    node = first.placement[0][0]
    other = "n1" if node == "n0" else "n0"
    await until("a checkpointed iteration", lambda: [
        r for r in watch.reports if r.job_id == job and r.iteration >= 30], watch)
    agent = live.procs[node]
    orphans = trainers_of(job, agent.pid)
    assert orphans, "the job's trainer runs under the agent"
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    lost = await until("the requeue", lambda: [
        t for t in watch.of(job) if t.state is JobState.PREEMPTED], watch)
    assert lost[0].cause == f"requeued: node {node} lost"
    state = json.loads((await nc.request(control_subject("scheduler"), b"", timeout=30)).data)
    assert state["lost"] == [node]  # what `loom status --json` shows operators
    await until("the job to finish", lambda: [
        t for t in watch.of(job) if t.state is JobState.FINISHED], watch)
    states = [(t.state, t.placement[0][0] if t.placement else None) for t in watch.of(job)]
    assert states == [(JobState.QUEUED, None), (JobState.RUNNING, node),
                      (JobState.PREEMPTED, None), (JobState.RUNNING, other),
                      (JobState.FINISHED, None)]
    resumed = [r for r in watch.reports if r.job_id == job and r.event == "started"
               and r.node_id == other]
    assert resumed and resumed[0].resumed and resumed[0].iteration >= 10  # from a checkpoint
    # Its trainer did not outlive the agent (it dies with it), so nothing trains twice.
    await until("the orphaned trainer to exit", lambda: not any(map(alive, orphans)), watch)
    live.agent(node)  # the node comes back with a fresh agent


async def partitioned_agent(nc: Any, live: Cluster, watch: Watch) -> None:
    job = f"nf-{secrets.token_hex(3)}-part"
    await nc.publish("loom.jobs.submit", submit(job, 2000))  # still training once requeued
    (first,) = await until("the job to start", lambda: [
        t for t in watch.of(job) if t.state is JobState.RUNNING], watch)
    node = first.placement[0][0]
    other = "n1" if node == "n0" else "n0"
    await until("progress", lambda: [
        r for r in watch.reports if r.job_id == job and r.iteration >= 20], watch)
    agent = live.procs[node]
    stale = trainers_of(job, agent.pid)
    assert stale
    agent.send_signal(signal.SIGSTOP)  # the agent is cut off; its trainer trains on
    try:
        await until("the requeue onto the other node", lambda: [
            t for t in watch.of(job) if t.state is JobState.RUNNING
            and t.placement[0][0] == other], watch)
        assert all(map(alive, stale))
    finally:
        agent.send_signal(signal.SIGCONT)
    await until("the stale trainer to stop", lambda: not any(map(alive, stale)), watch)
    await until("the job to finish", lambda: [
        t for t in watch.of(job) if t.state is JobState.FINISHED], watch)
    causes = [t.cause for t in watch.of(job)]
    assert causes[:3] == ["admitted", "started", f"requeued: node {node} lost"]
    stops = [s for c in watch.commands if c.node_id == node for s in c.stops
             if s.job_id == job]
    assert stops, "the returning node was told to stop the job"


async def failing_trainer(nc: Any, live: Cluster, watch: Watch) -> None:
    job = f"nf-{secrets.token_hex(3)}-fail"
    (live.ckpt / job).mkdir(parents=True)
    (live.ckpt / job / "checkpoint.pt").write_bytes(b"not a checkpoint")
    await nc.publish("loom.jobs.submit", submit(job, 50))
    (end,) = await until("the job to fail", lambda: [
        t for t in watch.of(job) if t.state is JobState.FAILED], watch)
    moves = [(t.state, t.cause) for t in watch.of(job)]
    # One retry, then failed. A busy machine may also requeue it off a node whose heartbeats
    # came late: that is not the trainer's failure and must not count as one.
    requeues = [c for s, c in moves if s is JobState.PREEMPTED]
    retries = [c for c in requeues if c.startswith("trainer failed on n")]
    assert len(retries) == 1 and "retry 1 of 1 at" in retries[0], moves
    assert all(c in retries or c.startswith("requeued: node ") for c in requeues), moves
    assert [s for s, _ in moves][:2] == [JobState.QUEUED, JobState.RUNNING], moves
    assert [s for s, _ in moves][-2:] == [JobState.RUNNING, JobState.FAILED], moves
    assert end.cause.startswith("failed: cannot read") and "checkpoint.pt" in end.cause
    assert end.status is not None and end.status.reason.startswith("trainer failed 2 time(s)")
