"""A live Loom cluster of real processes for fault tests, and an audit of its event stream.

`NatsProcess` is a nats-server on a fixed port and store directory, so it can be killed and
started again on the same files while clients reconnect to the same URL. `LiveCluster` runs
`loom serve` processes (placer, scheduler replicas, simulated node agents) and kills or
restarts any of them. `audit` reads the whole JetStream stream and checks what must hold
after any run: every job finished exactly once, no GPU held by two jobs at once, no job
without a terminal transition, no gap in the stream.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import DeadLetter, JobFinished, JobTransition, PlanDecided
from schemas.job import JobState
from services.runtime.natsserver import find_binary, free_port
from services.scheduler.leader import BUCKET, KEY, Lease

LOOM = [sys.executable, "-m", "loom.cli"]


@dataclass
class NatsProcess:
    store: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 15.0) -> None:
        self.proc = subprocess.Popen(
            [find_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
             "-sd", str(self.store / "js"), "-l", str(self.store / "nats-server.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:  # listening is not enough: JetStream must have recovered its store
            try:
                nc = await nats.connect(self.url, allow_reconnect=False, connect_timeout=1)
                try:
                    await nc.jetstream().account_info()
                    return
                finally:
                    await nc.close()
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"nats-server on {self.port} did not come up") from None
                await asyncio.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@dataclass
class LiveCluster:
    """`loom serve` processes on one NATS server, one cluster clock (`--origin`)."""

    nats_url: str
    cluster_file: Path
    logs: Path
    time_scale: float
    policy: str = "srtf"
    origin: float = field(default_factory=time.time)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    lease: tuple[float, float] = (4.0, 1.0)  # lease_s, renew_s of scheduler replicas

    @classmethod
    def write_cluster(cls, where: Path, spec: ClusterSpec) -> Path:
        path = where / "cluster.json"
        path.write_text(spec.model_dump_json())
        return path

    def _args(self, name: str) -> list[str]:
        common = ["--nats-url", self.nats_url, "--cluster", str(self.cluster_file),
                  "--time-scale", str(self.time_scale), "--origin", repr(self.origin),
                  "--log-level", "info"]
        if name == "placer":
            return ["placer", *common]
        if name.startswith("scheduler-"):
            lease_s, renew_s = self.lease
            return ["scheduler", *common, "--policy", self.policy, "--replica", name,
                    "--lease-s", str(lease_s), "--renew-s", str(renew_s)]
        if name == "scheduler":
            return ["scheduler", *common, "--policy", self.policy]
        return ["nodeagent", *common, "--node", name, "--trainers", "simulated"]

    def start(self, name: str) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen([*LOOM, "serve", *self._args(name)], stdout=log,
                                            stderr=subprocess.STDOUT, env=dict(os.environ))
        log.close()

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> list[str]:
        """SIGTERM every process; names of those that did not exit cleanly."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        bad = []
        for name, proc in self.procs.items():
            try:
                code = proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code not in (0, -signal.SIGKILL):
                bad.append(f"{name} exited with {code}")
        return bad


async def lease_holder(nc: Any) -> Lease | None:
    try:
        entry = await (await nc.jetstream().key_value(BUCKET)).get(KEY)
    except Exception:
        return None
    return None if entry.value is None else Lease.decode(entry.value)


@dataclass(frozen=True)
class Message:
    seq: int
    subject: str
    body: Any


async def read_all(nc: Any, stream: str = subjects.STREAM) -> list[Message]:
    """The whole stream, in order (undecodable payloads kept as raw bytes)."""
    js = nc.jetstream()
    last = (await js.stream_info(stream)).state.last_seq
    out: list[Message] = []
    if last == 0:
        return out
    psub = await js.pull_subscribe("loom.>", stream=stream, config=ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0))
    try:
        while not out or out[-1].seq < last:
            for msg in await psub.fetch(1000, timeout=5.0):
                try:
                    body: Any = decode(msg.data).body
                except Exception:
                    body = msg.data
                out.append(Message(msg.metadata.sequence.stream, msg.subject, body))
    finally:
        await psub.unsubscribe()
    return out


@dataclass
class Audit:
    submitted: int
    messages: int
    finished: Counter[str]
    finish_reports: Counter[str]
    unfinished: list[str]
    double_booked: list[str]
    gaps: list[int]
    terms: list[int]
    stale_plans_refused: int
    preemptions: int
    dead_letters: list[str]

    @property
    def ok(self) -> bool:
        return (not self.unfinished and not self.double_booked and not self.gaps
                and set(self.finished.values()) == {1}
                and set(self.finish_reports.values()) == {1})

    @property
    def suspects(self) -> list[str]:
        """The jobs that break "finished exactly once": the ones a failed audit should show."""
        twice = {j for c in (self.finished, self.finish_reports) for j, n in c.items() if n != 1}
        return sorted(twice | set(self.unfinished))


def audit(messages: list[Message], job_ids: list[str]) -> Audit:
    """Check the stream of a run (see module docstring). GPU bookings are replayed in stream
    order as the placer applies them: a plan's stops, then its launches, all at once; a
    finish report or a terminal transition frees a job's GPUs."""
    seqs = {m.seq for m in messages}
    gaps = [s for s in range(1, max(seqs, default=0) + 1) if s not in seqs]
    finished: Counter[str] = Counter()
    reports: Counter[str] = Counter()
    terminal: set[str] = set()
    double: list[str] = []
    holder: dict[tuple[str, int], str] = {}  # GPU → job holding it
    holds: dict[str, list[tuple[str, int]]] = {}
    terms: list[int] = []
    stale = preempted = 0
    dead: list[str] = []

    def release(job: str) -> None:
        for gpu in holds.pop(job, []):
            if holder.get(gpu) == job:
                del holder[gpu]

    for m in messages:
        b = m.body
        if isinstance(b, PlanDecided):
            if not terms or terms[-1] != b.term:
                terms.append(b.term)
            for job in [s.job_id for s in b.stops] + [x.job_id for x in b.launches]:
                release(job)
            for x in b.launches:
                mine = [(node, i) for node, gpus in x.placement for i in gpus]
                for gpu in mine:
                    other = holder.get(gpu)
                    if other is not None and other not in x.colocated:
                        double.append(f"seq {m.seq}: {x.job_id} on {gpu} held by {other}")
                    holder[gpu] = x.job_id
                holds[x.job_id] = mine
        elif isinstance(b, JobTransition):
            if b.state is JobState.FINISHED:
                finished[b.job_id] += 1
            if b.state is JobState.PREEMPTED:
                preempted += 1
            if b.state.terminal:
                terminal.add(b.job_id)
                release(b.job_id)
        elif isinstance(b, JobFinished):
            reports[b.job_id] += 1
            release(b.job_id)
        elif isinstance(b, DeadLetter):
            if "StaleTerm" in b.reason:
                stale += 1
            else:
                dead.append(f"{b.service}: {b.reason}")
    return Audit(submitted=len(job_ids), messages=len(messages), finished=finished,
                 finish_reports=reports,
                 unfinished=[j for j in job_ids if j not in terminal or finished[j] != 1],
                 double_booked=double, gaps=gaps, terms=terms, stale_plans_refused=stale,
                 preemptions=preempted, dead_letters=dead)


def history(messages: list[Message], job_id: str) -> list[str]:
    """Every stored message about `job_id`, one line each: what a failed run shows."""
    lines = []
    for m in messages:
        b = m.body
        about = getattr(b, "job_id", None) == job_id or (
            isinstance(b, PlanDecided)
            and job_id in {*(x.job_id for x in b.launches), *(x.job_id for x in b.stops)})
        if about:
            what = getattr(b, "state", None) or getattr(b, "event", None) or ""
            lines.append(f"{m.seq} {m.subject} {type(b).__name__} {what}".rstrip())
    return lines


async def submit(nc: Any, specs: list[Any]) -> None:
    """Submit jobs as a user would, each with its own `Nats-Msg-Id` (a retry counts once)."""
    from schemas.codec import encode
    from schemas.events import envelope
    from schemas.job import SubmitJob
    from services.runtime.bus import MSG_ID

    js = nc.jetstream()
    for spec in specs:
        env = envelope(SubmitJob.from_spec(spec), event_id=f"submit-{spec.job_id}",
                       occurred_at=time.time(), producer="user", causation_id=None)
        for attempt in range(60):  # the server may be coming back from a restart
            try:
                await js.publish(subjects.JOB_SUBMIT, encode(env),
                                 headers={MSG_ID: env.event_id}, stream=subjects.STREAM)
                break
            except Exception:
                if attempt == 59:
                    raise
                await asyncio.sleep(0.5)


class FinishWatch:
    """Counts FINISHED transitions as they are stored; survives a server restart."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.finished: set[str] = set()
        self._psub: Any = None

    async def poll(self) -> None:
        js = self.nc.jetstream()
        try:
            if self._psub is None:
                self._psub = await js.pull_subscribe(
                    subjects.JOB_TRANSITION, durable="chaos-watch", stream=subjects.STREAM,
                    config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT))
            for msg in await self._psub.fetch(500, timeout=1.0):
                body = decode(msg.data).body
                if isinstance(body, JobTransition) and body.state is JobState.FINISHED:
                    self.finished.add(body.job_id)
                await msg.ack()
        except Exception:  # no messages yet, or the server is restarting
            await asyncio.sleep(0.2)

    async def until(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.finished) < count and time.monotonic() < deadline:
            await self.poll()
        return len(self.finished) >= count


async def wait_services(nc: Any, count: int, timeout: float = 300.0) -> None:
    """Until `count` Loom services answer `$SRV.PING` (they start slowly on a busy machine)."""
    from loom.serve import ping

    deadline = time.monotonic() + timeout
    while len(await ping(nc)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {await ping(nc)} of {count} services came up")
        await asyncio.sleep(0.3)
