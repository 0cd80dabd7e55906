"""The live cluster the steps run on: NATS, the control plane, one node agent, and taps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpuval.probes import _comm, _telemetry_json, nvml_mps_clients, trainer_pids
from bench.gpuval.report import Report
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import NodeCommand, NodeHeartbeat, NodeInfo, TrainerReport
from services.nodeagent.gpu import DcgmBackend, FakeBackend, GpuBackend, detect_backend
from services.runtime.bus import MSG_ID
from services.runtime.children import die_with_parent
from services.runtime.natsserver import EmbeddedNats

NODE = "n0"
TERMINAL = ("finished", "failed", "rejected")
ITERATION_S = 0.01  # the submissions' speed estimate; only ordering depends on it


def make_backend(fake_gpus: int | None, report: Report) -> GpuBackend:
    """The backend `loom serve nodeagent` would use (`--gpu-backend auto`)."""
    if fake_gpus is not None:
        return FakeBackend(fake_gpus, node=NODE)
    try:
        DcgmBackend().close()
        report.data.setdefault("gpu", {})["dcgm"] = "available"
    except Exception as exc:  # the expected case without DCGM: `auto` falls back to NVML
        report.data.setdefault("gpu", {})["dcgm"] = f"{type(exc).__name__}: {exc}"
    return detect_backend("auto")


# -- step 3: the live cluster ------------------------------------------------------------------
class Tap:
    """Every protocol record the in-process node agent reads from its trainers, timestamped.

    The agent publishes only part of each record (`TrainerReport`); the checkpoint's write
    time and size, the startup time and the device stay in the agent. Wrapping its line
    handler reads them without changing what it does.
    """

    def __init__(self) -> None:
        self.records: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self._original: Any = None
        self.shell: Any = None  # the node agent's shell, once a trainer has written a line

    def install(self) -> None:
        from services.nodeagent.live import NodeAgentShell, split_key
        original = NodeAgentShell._on_line
        self._original = original

        async def on_line(shell: NodeAgentShell, key: str, line: str) -> None:
            self.shell = shell
            job_id, rank = split_key(key)
            if rank == 0:
                with contextlib.suppress(ValueError):
                    rec = json.loads(line)
                    if isinstance(rec, dict) and "event" in rec:
                        self.records.setdefault(job_id, []).append((time.monotonic(), rec))
            await original(shell, key, line)

        setattr(NodeAgentShell, "_on_line", on_line)  # noqa: B010 - a method, on purpose

    def remove(self) -> None:
        if self._original is not None:
            from services.nodeagent.live import NodeAgentShell
            setattr(NodeAgentShell, "_on_line", self._original)  # noqa: B010

    def of(self, job_id: str) -> list[dict[str, Any]]:
        return [r for _, r in self.records.get(job_id, [])]

    def grouped_pid(self, job_id: str) -> int | None:
        """The PID of the job's rank 0 if the agent runs it now from a launch with partners
        (not a run still stopping, whose relaunch with them waits for it to exit)."""
        from services.nodeagent.live import process_key
        if self.shell is None:
            return None
        job = self.shell.core.jobs.get(job_id)
        if job is None or job.stopping or len(job.launch.colocated) < 2:
            return None
        pid: int | None = self.shell.supervisor.running.get(process_key(job_id, 0))
        return pid

    async def wait(self, job_id: str, test: Callable[[dict[str, Any]], bool], timeout: float,
                   since: int = 0) -> tuple[float, dict[str, Any]]:
        """The first record of `job_id` from index `since` on that passes `test`."""
        deadline = time.monotonic() + timeout
        while True:
            for t, rec in self.records.get(job_id, [])[since:]:
                if test(rec):
                    return t, rec
            if time.monotonic() > deadline:
                last = self.of(job_id)[-1:]
                raise TimeoutError(f"{job_id}: no such record in {timeout:.0f} s (last: {last})")
            await asyncio.sleep(0.05)


@dataclass
class Cluster:
    url: str
    nc: Any
    js: Any
    server: EmbeddedNats
    children: list[asyncio.subprocess.Process]
    agent: asyncio.Task[int] | None
    agent_stop: asyncio.Event
    tap: Tap
    work: Path
    probe: GpuBackend  # this script's own view of the GPUs, beside the agent's
    reports: list[tuple[float, TrainerReport]] = field(default_factory=list)
    heartbeats: list[tuple[float, NodeHeartbeat]] = field(default_factory=list)
    commands: list[tuple[float, NodeCommand]] = field(default_factory=list)
    node_info: list[NodeInfo] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # this script's own telemetry
    sampler: asyncio.Task[None] | None = None

    async def state(self) -> dict[str, Any]:
        from loom.serve import control_subject
        reply = await self.nc.request(control_subject("scheduler"), b"", timeout=10)
        state: dict[str, Any] = json.loads(reply.data)
        return state

    async def submit(self, job_id: str, model: str, iterations: int,
                     stages: tuple[float, ...] | None = None) -> None:
        body: dict[str, Any] = {"job_id": job_id, "model": model, "gpus": 1,
                                "iterations": iterations, "iteration_time_s": ITERATION_S,
                                "tenant": "gpuval"}
        if stages is not None:
            body["stage_times_s"] = list(stages)
        await self.js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                              headers={MSG_ID: f"submit.{job_id}"})

    async def operate(self, command: str, job: str | None = None,
                      policy: str | None = None) -> str:
        """What `loom suspend|resume|cancel|set-policy` does (it confirms from the state)."""
        from loom.live_cli import _operate
        return await _operate(self.url, command, job, None, policy)

    async def wait_terminal(self, jobs: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            rows = {j["job_id"]: j for j in (await self.state())["jobs"]}
            if all(rows.get(j, {}).get("state") in TERMINAL for j in jobs):
                return rows
            if time.monotonic() > deadline:
                return rows
            await asyncio.sleep(0.5)

    async def cancel_unfinished(self, rows: dict[str, dict[str, Any]], jobs: list[str],
                                report: Report) -> None:
        for j in jobs:
            if rows.get(j, {}).get("state") not in TERMINAL:
                report.finding(f"{j} did not finish in its time cap "
                               f"(state {rows.get(j, {}).get('state')}); cancelled")
                with contextlib.suppress(Exception):
                    await self.operate("cancel", j)


async def start_cluster(work: Path, fake_gpus: int | None, gpus: int, report: Report,
                        probe: GpuBackend, started: list[Cluster]) -> Cluster:
    """NATS, the control plane and the agent; `started` gets the cluster as soon as it has
    processes to stop, so a start that fails half-way is still torn down."""
    import nats

    from loom.builders import ServeOptions
    from loom.serve import ping, serve
    from loom.up import UpOptions, up_commands
    from services.runtime.nats_live import ensure_stream

    (work / "nats").mkdir()
    server = await EmbeddedNats.start(store=work / "nats")
    cluster_spec = ClusterSpec.uniform(1, 1, gpus, name="gpuval")
    spec_file = work / "cluster.json"
    spec_file.write_text(cluster_spec.model_dump_json())
    origin = time.time()  # every service of the cluster shares it, as under `loom up`
    up = UpOptions(cluster_spec, str(spec_file), nats_url=server.url, policy="fifo",
                   local_nodes=False, state_dir=work)
    children = []
    for cmd in up_commands(up, server.url, origin):
        children.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loom.cli", "serve", *cmd, preexec_fn=die_with_parent))
    nc = await nats.connect(server.url)
    cluster = Cluster(server.url, nc, nc.jetstream(), server, children, None, asyncio.Event(),
                      Tap(), work, probe)
    started.append(cluster)
    await ensure_stream(cluster.js)

    async def on_report(msg: Any) -> None:
        body = decode(msg.data).body
        t = time.monotonic()
        if isinstance(body, TrainerReport):
            cluster.reports.append((t, body))
        elif isinstance(body, NodeHeartbeat):
            cluster.heartbeats.append((t, body))
        elif isinstance(body, NodeCommand):
            cluster.commands.append((t, body))
        elif isinstance(body, NodeInfo):
            cluster.node_info.append(body)

    for subject in (subjects.JOB_PROGRESS, subjects.NODE_HEARTBEAT, subjects.NODE_COMMAND_ALL,
                    subjects.NODE_INFO):
        await nc.subscribe(subject, cb=on_report)
    cluster.tap.install()
    opts = ServeOptions("nodeagent", server.url, cluster_spec, node=NODE, trainers="pytorch",
                        fake_gpus=fake_gpus, gpu_backend="auto",
                        checkpoint_root=work / "checkpoints", grace_s=30.0, heartbeat_s=1.0,
                        origin=origin)
    cluster.agent = asyncio.create_task(serve(opts, cluster.agent_stop))
    deadline = time.monotonic() + 60
    while True:
        if cluster.agent.done():
            cluster.agent.result()  # raises what stopped it
            raise RuntimeError("the node agent exited at start")
        names = await ping(nc)
        if len(names) >= 4 and cluster.node_info:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"services answering: {names}; node info: {cluster.node_info}")
        await asyncio.sleep(0.3)
    info = cluster.node_info[-1]
    report.data["cluster"] = {"services": names, "node_info": info.model_dump(mode="json")}
    report.measure("services up", ", ".join(names))
    report.measure("node agent backend / GPUs", f"{info.backend} / {len(info.gpus)}")
    cluster.sampler = asyncio.create_task(_sample(cluster))
    return cluster


MPS_DIRS = ("/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/bin", "/usr/sbin")


def find_mps_control(report: Report) -> str | None:
    """nvidia-cuda-mps-control, put on PATH if it is only in the driver's usual places (the
    agent runs it by name)."""
    found = shutil.which("nvidia-cuda-mps-control")
    if found:
        return found
    for folder in MPS_DIRS:
        candidate = Path(folder) / "nvidia-cuda-mps-control"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            os.environ["PATH"] = f"{os.environ.get('PATH', '')}{os.pathsep}{folder}"
            report.data.setdefault("notes", []).append(f"{candidate} was not on PATH; added")
            return str(candidate)
    return None


async def _sample(cluster: Cluster) -> None:
    """This script's own telemetry and trainer PIDs every half second, while the cluster runs."""
    while True:
        try:
            telemetry = await asyncio.to_thread(cluster.probe.telemetry)
            cluster.samples.append({"t": time.monotonic(), "telemetry": _telemetry_json(telemetry),
                                    "trainers": trainer_pids()})
        except Exception as exc:
            cluster.samples.append({"t": time.monotonic(), "error": f"{type(exc).__name__}: "
                                                                    f"{exc}"})
        await asyncio.sleep(0.5)


async def stop_cluster(cluster: Cluster, report: Report) -> None:
    t0 = time.monotonic()
    if cluster.sampler is not None:
        cluster.sampler.cancel()
    cluster.agent_stop.set()
    if cluster.agent is not None:
        try:
            code = await asyncio.wait_for(cluster.agent, 60)
            report.data.setdefault("teardown", {})["agent_exit"] = code
        except Exception as exc:
            report.finding(f"node agent did not stop cleanly: {type(exc).__name__}: {exc}")
    cluster.tap.remove()
    for child in cluster.children:
        if child.returncode is None:
            child.terminate()
    codes = []
    for child in cluster.children:
        try:
            codes.append(await asyncio.wait_for(child.wait(), 20))
        except TimeoutError:
            child.kill()
            codes.append(await child.wait())
    report.data.setdefault("teardown", {})["control_plane_exits"] = codes
    with contextlib.suppress(Exception):
        await cluster.nc.close()
    await cluster.server.stop()
    left = trainer_pids()
    if left:
        report.finding(f"trainer processes left running after the agent stopped: {left}")
    report.data["teardown"]["seconds"] = round(time.monotonic() - t0, 1)


def gpu_processes(cluster: Cluster) -> dict[str, Any]:
    """Who NVML says is on the GPUs now: telemetry's list, and its MPS-client list."""
    last = next((s for s in reversed(cluster.samples) if "telemetry" in s), None)
    procs = ({str(p): _comm(p) for t in last["telemetry"] for p in t["processes"]}
             if last else {})
    return {"telemetry_processes": procs, "mps_clients": nvml_mps_clients(cluster.probe)}
