"""Real-GPU validation of the node agent (issue 23, part 3): NVML, a live cluster, MPS.

On a machine with NVIDIA GPUs this exercises what only a GPU can prove, each step guarded
(a failure is printed with its traceback and the next step still runs) and bounded by
`--budget-s`:

1. environment: nvidia-smi, the driver, torch and CUDA, NCCL, the MPS control binary;
2. gpu backend: the node agent's own backend (`detect_backend`, as `loom serve nodeagent`
   picks it): discover(), topology(), telemetry() idle and while a real trainer process
   (started with the supervisor's job environment) trains on GPU 0;
3. cluster: an embedded nats-server, the control plane as `loom up` starts it (one
   `loom serve` process per service, from `loom.up.up_commands`) and one node agent on the
   real backend (`loom.serve.serve`, in this process so its trainers' records can be read);
4. families: one short 1-GPU job per workload family, submitted as `loom submit` does;
5. preemption: a job suspended and resumed (`loom suspend|resume`): stop latency, the
   checkpoint's write time and size, restart latency, and that it resumed where it stopped;
6. mps: under `set-policy muri-s`, two jobs with complementary stage times interleaved on one
   GPU: the agent's MPS daemon and each trainer's active-thread percentage, iterations/s alone
   (step 4) and co-located.

It prints a summary table and writes it, with every detail, to OUT/gpu_validation.json
(after each step, so an interrupted run still leaves its figures).

    python3 bench/gpu_validation.py [--out DIR] [--budget-s S]   # on a GPU machine
    python3 bench/gpu_validation.py --fake-gpus 1                # here: FakeBackend, CPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python3 bench/gpu_validation.py` from a plain checkout
    sys.path.insert(0, str(REPO))

from domain.trainer_config import TrainerConfig  # noqa: E402
from schemas import subjects  # noqa: E402
from schemas.cluster import ClusterSpec  # noqa: E402
from schemas.codec import decode  # noqa: E402
from schemas.events import NodeCommand, NodeHeartbeat, NodeInfo, TrainerReport  # noqa: E402
from services.nodeagent.gpu import (  # noqa: E402
    DcgmBackend,
    FakeBackend,
    GpuBackend,
    GpuTelemetry,
    detect_backend,
)
from services.nodeagent.supervisor import ProcessSpec, job_environment  # noqa: E402
from services.runtime.bus import MSG_ID  # noqa: E402
from services.runtime.children import die_with_parent  # noqa: E402
from services.runtime.natsserver import EmbeddedNats  # noqa: E402

NODE = "n0"
FAMILY_MODELS = {"cnn": "resnet18", "transformer": "gpt2", "lstm": "lstm", "rl": "a2c"}
TERMINAL = ("finished", "failed", "rejected")
ITERATION_S = 0.01  # the submissions' speed estimate; only ordering depends on it
# Muri interleaves jobs whose stages overlap: one data-heavy, one compute-heavy.
MPS_PAIR: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("cnn", (0.008, 0.002, 0.0)), ("transformer", (0.002, 0.008, 0.0)))
TEARDOWN_S = 25.0  # kept out of the budget for stopping the cluster
MIN_STEP_S = 10.0  # a step with less budget left than this is skipped


# -- report ----------------------------------------------------------------------------------
@dataclass
class Report:
    mode: str
    out: Path
    data: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: list[tuple[str, str]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def measure(self, what: str, value: object) -> None:
        text = _fmt(value)
        self.summary.append((what, text))
        print(f"   {what}: {text}", flush=True)

    def finding(self, text: str) -> None:
        self.findings.append(text)
        print(f"   FINDING: {text}", flush=True)

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "written_at": datetime.now(UTC).isoformat(),
                "elapsed_s": round(time.monotonic() - self.started, 1), "steps": self.steps,
                "summary": [{"what": w, "value": v} for w, v in self.summary],
                "findings": self.findings, **self.data}

    def write(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "gpu_validation.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.as_json(), indent=2, default=str))
        tmp.replace(path)
        return path


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if value is None:
        return "-"
    return str(value)


@dataclass
class Budget:
    total_s: float
    t0: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.total_s - TEARDOWN_S - (time.monotonic() - self.t0)


async def run_step(report: Report, budget: Budget, name: str, cap_s: float,
                   work: Callable[[], Awaitable[None]], *, skip: str | None = None) -> bool:
    """Run one step within min(cap, budget left); record ok, skipped or the error and why."""
    print(f"== {name}", flush=True)
    t0 = time.monotonic()
    left = budget.left()
    if skip is None and left < MIN_STEP_S:
        skip = f"budget exhausted ({left:.0f} s left)"
    if skip is not None:
        report.steps[name] = {"ok": False, "skipped": skip}
        print(f"   skipped: {skip}", flush=True)
        report.write()
        return False
    timeout = min(cap_s, left)
    entry: dict[str, Any] = {"ok": False, "skipped": None, "error": None}
    try:
        await asyncio.wait_for(work(), timeout)
        entry["ok"] = True
    except TimeoutError:
        entry["error"] = f"timed out after {timeout:.0f} s"
        print(f"   ERROR: {entry['error']}", flush=True)
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["traceback"] = traceback.format_exc()
        print(f"   ERROR: {entry['error']}\n{entry['traceback']}", flush=True)
    entry["elapsed_s"] = round(time.monotonic() - t0, 2)
    report.steps[name] = entry
    report.write()
    return bool(entry["ok"])


# -- step 1: environment ---------------------------------------------------------------------
# Run in a child: the validating process itself never opens a CUDA context, which would sit on
# the GPU beside the trainers and the MPS server for the whole run.
TORCH_PROBE = r"""
import json, torch
out = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
try:
    out["cuda_available"] = torch.cuda.is_available()
    out["device_count"] = torch.cuda.device_count()
    if out["cuda_available"]:
        out["device_name"] = torch.cuda.get_device_name(0)
        cap = torch.cuda.get_device_capability(0)
        out["capability"] = f"{cap[0]}.{cap[1]}"
except Exception as exc:
    out["cuda_error"] = f"{type(exc).__name__}: {exc}"
try:
    v = torch.cuda.nccl.version()
    out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as exc:
    out["nccl_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _run(argv: list[str], timeout: float = 60.0) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    return done.returncode, (done.stdout + done.stderr).strip()


def doctor(work: Path, fake_gpus: int | None) -> dict[str, Any]:
    """`loom doctor --json` as an operator runs it before a node joins (no NATS yet; the
    checkpoint root in the run's folder), with its exit status."""
    argv = [sys.executable, "-m", "loom", "doctor", "--json", "--no-nats",
            "--checkpoint-root", str(work / "doctor-ckpt")]
    if fake_gpus is not None:
        argv += ["--fake-gpus", str(fake_gpus)]
    code, output = _run(argv, timeout=50.0)
    try:
        found: dict[str, Any] = json.loads(output[output.index("{"):])
    except ValueError:
        return {"exit": code, "output": output[-2000:]}
    found["exit"] = code
    return found


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                           "platform": platform.platform(), "machine": platform.machine()}
    if shutil.which("nvidia-smi"):
        env["nvidia_smi_L"] = _run(["nvidia-smi", "-L"])[1]
        env["nvidia_smi_query"] = _run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode,"
             "mig.mode.current", "--format=csv,noheader"])[1]
    else:
        env["nvidia_smi_L"] = "nvidia-smi not on PATH"
    code, text = _run([sys.executable, "-c", TORCH_PROBE], timeout=120)
    try:
        env.update(json.loads(text.splitlines()[-1]))
    except (ValueError, IndexError):
        env["torch_probe_error"] = f"exit {code}: {text[-2000:]}"
    env["mps_control"] = shutil.which("nvidia-cuda-mps-control")
    try:
        env["nvidia_ml_py"] = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        env["nvidia_ml_py"] = None
    return env


# -- step 2: the GPU backend -------------------------------------------------------------------
def _telemetry_json(samples: list[GpuTelemetry]) -> list[dict[str, Any]]:
    return [{"uuid": t.uuid, "utilization": t.utilization_ratio,
             "memory_used_mib": round(t.memory_used_bytes / 2**20, 1),
             "processes": list(t.processes)} for t in samples]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


JOB_PREFIX = "gv-"  # every job this script runs: trainers of other runs on the machine are not its


def trainer_pids() -> dict[str, int]:
    """job id → PID of the newest `python -m services.trainer` process of each of this
    script's jobs. A run that is stopping (or a child it forked, which has its command line)
    can still be there beside its job's next run; PIDs wrap, so the newest is the one that
    started last, not the largest."""
    found: dict[str, tuple[int, int]] = {}  # job → (start time in clock ticks, PID)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"services.trainer" not in argv or b"--job-id" not in argv:
                continue
            i = argv.index(b"--job-id")
            if i + 1 >= len(argv) or not argv[i + 1].startswith(JOB_PREFIX.encode()):
                continue
            # Field 22 of stat, counted after the command name (which may hold spaces).
            started = int((entry / "stat").read_text().rpartition(")")[2].split()[19])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        job = argv[i + 1].decode()
        newest = (started, int(entry.name))
        if job not in found or newest > found[job]:
            found[job] = newest
    return {job: pid for job, (_, pid) in found.items()}


def process_env(pid: int, prefix: str = "CUDA_") -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as exc:
        return {"error": str(exc)}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs if k.startswith(prefix)}


def mps_processes() -> dict[int, str]:
    """PID → name of the MPS control daemon and servers running here."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _comm(int(entry.name)).startswith("nvidia-cuda-mps"):
            out[int(entry.name)] = _comm(int(entry.name))
    return out


def process_group(pid: int) -> dict[str, int] | str:
    """A process's group and session (/proc/PID/stat fields 5 and 6): who a group signal hits."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError as exc:
        return str(exc)
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return {"pgid": int(fields[2]), "sid": int(fields[3])}


def nvml_mps_clients(backend: GpuBackend) -> list[list[int]] | str:
    """NVML's own list of MPS client processes per GPU, where the bindings have the call."""
    try:
        import pynvml
    except ImportError:
        return "pynvml missing"
    call = getattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
    if call is None or backend.name == "fake":
        return "not available"
    try:
        n = pynvml.nvmlDeviceGetCount()
        return [[int(p.pid) for p in call(pynvml.nvmlDeviceGetHandleByIndex(i))]
                for i in range(n)]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


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


class LineReader:
    """The protocol records of a trainer this script started itself (step 2)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.records: list[dict[str, Any]] = []
        self.task = asyncio.create_task(self._read(proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            with contextlib.suppress(ValueError):
                rec = json.loads(raw)
                if isinstance(rec, dict) and "event" in rec:
                    self.records.append(rec)

    def count(self, event: str) -> int:
        return sum(r["event"] == event for r in self.records)


async def busy_telemetry(backend: GpuBackend, gpu_uuid: str, work: Path,
                         sample_s: float) -> dict[str, Any]:
    """telemetry() while a real trainer trains on `gpu_uuid`, in the agent's job environment."""
    cfg = TrainerConfig(job_id="gv-busy", model="transformer", iterations=10**7,
                        batch_size=256, checkpoint_dir=str(work / "busy-ckpt"), device="auto",
                        report_every=50, log_level="warning")
    argv = (sys.executable, "-m", "services.trainer", *cfg.to_argv())
    env = job_environment(ProcessSpec("gv-busy", argv, (gpu_uuid,)))
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    reader = LineReader(proc)
    out: dict[str, Any] = {"pid": proc.pid, "samples": [], "errors": []}
    try:
        deadline = time.monotonic() + 90
        while reader.count("progress") < 2:
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"busy trainer did not train (exit {proc.returncode}): "
                                   f"{reader.records[-1:]}")
            await asyncio.sleep(0.1)
        started = next(r for r in reader.records if r["event"] == "started")
        out["device"] = started["device"]
        end = time.monotonic() + sample_s
        while time.monotonic() < end:
            try:
                samples = await asyncio.to_thread(backend.telemetry)
                out["samples"].append(_telemetry_json(samples))
            except Exception as exc:
                out["errors"].append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.5)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.task, 5)
    mine = [s for sample in out["samples"] for s in sample if s["uuid"] == gpu_uuid]
    out["max_utilization"] = max((s["utilization"] for s in mine), default=None)
    out["max_memory_used_mib"] = max((s["memory_used_mib"] for s in mine), default=None)
    seen = {p for s in mine for p in s["processes"]}
    out["pids_seen"] = {str(p): _comm(p) for p in sorted(seen)}
    out["trainer_pid_seen"] = proc.pid in seen
    out["exit_code"] = proc.returncode
    last = reader.records[-1]["event"] if reader.records else None
    out["last_record"] = last
    return out


async def attempt(report: Report, errors: dict[str, str], label: str,
                  call: Callable[[], Awaitable[Any]]) -> Any:
    """One backend call: its result, or None with the traceback printed and kept (a call that
    raises on a real GPU is a finding, and the calls after it still run)."""
    try:
        return await call()
    except Exception as exc:
        errors[label] = traceback.format_exc()
        report.finding(f"{label} raised {type(exc).__name__}: {exc}")
        print(errors[label], flush=True)
        return None


async def gpu_step(backend: GpuBackend, report: Report, work: Path, real: bool) -> None:
    gpu: dict[str, Any] = report.data.setdefault("gpu", {})
    errors: dict[str, str] = gpu.setdefault("errors", {})
    gpu["backend"] = backend.name
    report.measure("backend", backend.name)
    found = await asyncio.to_thread(backend.discover)  # nothing else runs without it
    gpu["discover"] = [{"index": g.index, "uuid": g.uuid, "name": g.name,
                        "memory_gib": round(g.memory_bytes / 2**30, 2),
                        "pci_bus_id": g.pci_bus_id} for g in found]
    report.measure("GPUs discovered", len(found))
    if not found:
        raise RuntimeError("discover() found no GPU")
    report.measure("GPU 0", f"{found[0].name}, {found[0].memory_bytes / 2**30:.1f} GiB, "
                            f"{found[0].uuid}, bus {found[0].pci_bus_id}")
    links = await attempt(report, errors, "topology()",
                          lambda: asyncio.to_thread(backend.topology))
    if links is not None:
        gpu["topology"] = [{"a": x.a, "b": x.b, "kind": x.kind} for x in links]
        report.measure("topology links", ", ".join(x.kind for x in links) or "none (one GPU)")
    idle = await attempt(report, errors, "telemetry() idle",
                         lambda: asyncio.to_thread(backend.telemetry))
    if idle is not None:
        gpu["telemetry_idle"] = _telemetry_json(idle)
        report.measure("idle util / memory used (GPU 0)",
                       f"{idle[0].utilization_ratio:.2f} / "
                       f"{idle[0].memory_used_bytes / 2**20:.0f} MiB")
    busy = await busy_telemetry(backend, found[0].uuid, work, 4.0 if real else 1.0)
    gpu["telemetry_busy"] = busy
    report.measure("busy trainer device", busy.get("device"))
    report.measure("busy util max / memory used max (GPU 0)",
                   f"{_fmt(busy['max_utilization'])} / {_fmt(busy['max_memory_used_mib'])} MiB")
    report.measure("busy trainer PID in telemetry processes", busy["trainer_pid_seen"])
    if busy["errors"]:
        report.finding(f"telemetry() raised while the trainer was busy: {busy['errors'][0]}")
    if real:
        if busy.get("device", "").startswith("cpu"):
            report.finding("the busy trainer ran on the CPU with GPU 0 visible (device auto)")
        if not busy["trainer_pid_seen"]:
            report.finding(f"telemetry().processes never listed the trainer's PID {busy['pid']}"
                           f" (saw {busy['pids_seen']})")
        if (busy["max_utilization"] or 0) <= 0:
            report.finding("telemetry() reported 0 utilisation while a trainer was busy")


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


# -- what the trainers' records say --------------------------------------------------------------
@dataclass
class Run:
    """One launch of a job: its `started` record, progress, checkpoints and end."""

    started: dict[str, Any]
    t_started: float
    progress: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None


def runs_of(records: list[tuple[float, dict[str, Any]]]) -> list[Run]:
    runs: list[Run] = []
    for t, rec in records:
        if rec["event"] == "started":
            runs.append(Run(rec, t))
        elif not runs:
            continue  # a record before any start (a failed launch): kept in the raw list
        elif rec["event"] == "progress":
            runs[-1].progress.append(rec)
        elif rec["event"] == "checkpointed":
            runs[-1].checkpoints.append(rec)
        else:
            runs[-1].end = rec
    return runs


def rate(progress: list[dict[str, Any]], lo: float = -math.inf,
         hi: float = math.inf) -> float | None:
    """Iterations per second between progress records (trainer clock), within [lo, hi]: from
    the first record on, so the warm-up before it (CUDA context, kernel loads) is left out."""
    pts = [(p["ts"], p["iteration"]) for p in progress
           if not p.get("fast_forward") and lo <= p["ts"] <= hi]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return float(pts[-1][1] - pts[0][1]) / float(pts[-1][0] - pts[0][0])


def job_result(cluster: Cluster, job_id: str, row: dict[str, Any]) -> dict[str, Any]:
    records = cluster.tap.records.get(job_id, [])
    runs = runs_of(records)
    out: dict[str, Any] = {"job_id": job_id, "state": row.get("state"),
                           "reason": row.get("reason"), "launches": len(runs),
                           "iterations": row.get("iterations")}
    done = [r["iteration"] for _, r in records if isinstance(r.get("iteration"), int)]
    out["iterations_done"] = max(done, default=0)
    # What happened, in order (progress left out): launches, checkpoints, stops, failures.
    t0 = records[0][0] if records else 0.0
    out["timeline"] = [f"{t - t0:.2f}s {r['event']}@{r.get('iteration')}"
                       + (" resumed" if r.get("resumed") else "")
                       for t, r in records if r["event"] != "progress"]
    failed = [r for _, r in records if r["event"] == "failed"]
    if failed:
        out["failure"] = failed[-1].get("reason")
    if not runs:
        return out
    last = runs[-1]
    out["device"] = last.started.get("device")
    out["startup_s"] = last.started.get("startup_s")
    out["it_per_s"] = rate(last.progress)
    if last.end is not None:
        out["end"] = last.end["event"]
        out["final_loss"] = last.end.get("loss")
        out["wall_s"] = last.end.get("wall_s")
        prof = last.end.get("profile")
        if prof and prof.get("iteration_s"):
            out["profile_it_per_s"] = 1.0 / prof["iteration_s"]
            out["stage_ms"] = {k: round(1e3 * prof[k], 3)
                               for k in ("data_s", "compute_s", "comm_s", "iteration_s")}
    pids = {s["trainers"].get(job_id) for s in cluster.samples if "trainers" in s} - {None}
    seen = [s for s in cluster.samples if "telemetry" in s and s["trainers"].get(job_id)]
    if seen:
        out["max_utilization"] = max(t["utilization"] for s in seen for t in s["telemetry"])
        out["max_memory_used_mib"] = max(t["memory_used_mib"] for s in seen
                                         for t in s["telemetry"])
        listed = {p for s in seen for t in s["telemetry"] for p in t["processes"]}
        out["pid_in_telemetry"] = bool(pids & listed)
    return out


# -- step 4: one job per workload family -------------------------------------------------------
async def families_step(cluster: Cluster, report: Report, iterations: int, cap_s: float,
                        real: bool) -> None:
    jobs = {f"gv-{family}": model for family, model in FAMILY_MODELS.items()}
    for job_id, model in jobs.items():
        await cluster.submit(job_id, model, iterations)
    rows = await cluster.wait_terminal(list(jobs), cap_s)
    await cluster.cancel_unfinished(rows, list(jobs), report)
    results = {}
    for (job_id, model), family in zip(jobs.items(), FAMILY_MODELS, strict=True):
        res = job_result(cluster, job_id, rows.get(job_id, {}))
        res.update(family=family, model=model)
        results[family] = res
        report.measure(f"{family} ({model}) it/s alone",
                       f"{_fmt(res.get('it_per_s'))} [{res['state']}, "
                       f"{res['iterations_done']}/{iterations} it, {res.get('device')}, "
                       f"startup {_fmt(res.get('startup_s'))} s]")
        if real and str(res.get("device", "")).startswith("cpu"):
            report.finding(f"{job_id} trained on the CPU on a GPU node (device auto)")
        if real and res.get("pid_in_telemetry") is False:
            report.finding(f"{job_id}: its trainer's PID never appeared in telemetry processes")
    report.data["families"] = results
    beats = [hb for _, hb in cluster.heartbeats]
    gpu_samples = [g for hb in beats for g in hb.gpus]
    report.data["heartbeats"] = {
        "count": len(beats), "with_gpu_samples": sum(1 for hb in beats if hb.gpus),
        "max_utilization": max((g.utilization_ratio for g in gpu_samples), default=None),
        "max_memory_used_mib": max((g.memory_used_bytes / 2**20 for g in gpu_samples),
                                   default=None)}
    hb = report.data["heartbeats"]
    report.measure("heartbeats (with GPU samples) / max util in them",
                   f"{hb['count']} ({hb['with_gpu_samples']}) / {_fmt(hb['max_utilization'])}")
    if beats and not hb["with_gpu_samples"]:
        report.finding("the node agent's heartbeats carried no GPU telemetry")
    if not all(r["state"] == "finished" and r["iterations_done"] == iterations
               for r in results.values()):
        raise RuntimeError("not every family job finished its iterations: "
                           + ", ".join(f"{f}: {r['state']} {r['iterations_done']}"
                                       for f, r in results.items()))


# -- step 5: preempted and resumed ---------------------------------------------------------------
async def preemption_step(cluster: Cluster, report: Report, iterations: int,
                          cap_s: float) -> None:
    job, tap = "gv-preempt", cluster.tap
    total = 2 * iterations
    await cluster.submit(job, "resnet18", total)
    await tap.wait(job, lambda r: r["event"] == "progress" and r["iteration"] >= iterations // 4,
                   cap_s / 2)
    n = len(tap.records.get(job, []))
    t_suspend = time.monotonic()
    said = await cluster.operate("suspend", job)
    t_stopped, stopped = await tap.wait(job, lambda r: r["event"] == "stopped", 60, since=n)
    ckpts = [r for r in tap.of(job)[n:] if r["event"] == "checkpointed"]
    res: dict[str, Any] = {"suspend": said, "stopped_at": stopped["iteration"],
                           "stop_latency_s": t_stopped - t_suspend,
                           "loss_at_stop": stopped.get("loss")}
    if ckpts:
        res.update(checkpoint_write_s=ckpts[-1]["write_s"], checkpoint_bytes=ckpts[-1]["bytes"],
                   checkpoint_reason=ckpts[-1]["reason"])
    # Resume once the stopped run is gone, so the restart is measured from a free GPU.
    deadline = time.monotonic() + 30
    while job in trainer_pids() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    res["exit_after_stop_s"] = time.monotonic() - t_suspend
    n = len(tap.records.get(job, []))
    t_resume = time.monotonic()
    res["resume"] = await cluster.operate("resume", job)
    t_started, started = await tap.wait(job, lambda r: r["event"] == "started", 60, since=n)
    t_first, first = await tap.wait(job, lambda r: r["event"] == "progress", 60, since=n)
    res.update(restart_latency_s=t_started - t_resume, trainer_startup_s=started["startup_s"],
               time_to_first_progress_s=t_first - t_resume, resumed=started["resumed"],
               resumed_at=started["iteration"], first_loss_after=first.get("loss"),
               device=started.get("device"))
    rows = await cluster.wait_terminal([job], cap_s / 2)
    await cluster.cancel_unfinished(rows, [job], report)
    res.update(job_result(cluster, job, rows.get(job, {})))
    report.data["preemption"] = res
    report.measure("preempt: stopped at / resumed at (iteration)",
                   f"{res['stopped_at']} / {res['resumed_at']} (resumed={res['resumed']})")
    report.measure("preempt: suspend → stopped (s)", res["stop_latency_s"])
    report.measure("preempt: checkpoint write (s) / size (bytes)",
                   f"{_fmt(res.get('checkpoint_write_s'))} / {_fmt(res.get('checkpoint_bytes'))}")
    report.measure("preempt: resume → started (s) / trainer startup (s)",
                   f"{res['restart_latency_s']:.3g} / {res['trainer_startup_s']:.3g}")
    report.measure("preempt: resume → first progress (s)", res["time_to_first_progress_s"])
    report.measure("preempt: final state / iterations",
                   f"{res['state']} / {res['iterations_done']}/{total}")
    if not (res["resumed"] and res["resumed_at"] == res["stopped_at"] > 0):
        raise RuntimeError(f"did not resume from its checkpoint: stopped at "
                           f"{res['stopped_at']}, started at {res['resumed_at']}")
    if res["state"] != "finished" or res["iterations_done"] != total:
        raise RuntimeError(f"resumed job ended {res['state']} at {res['iterations_done']}")


# -- step 6: two jobs interleaved on one GPU under MPS -------------------------------------------
async def mps_step(cluster: Cluster, report: Report, iterations: int, cap_s: float,
                   target_s: float, real: bool) -> None:
    res: dict[str, Any] = {}
    report.data["mps"] = res
    res["set_policy"] = await cluster.operate("set-policy", policy="muri-s")
    alone = report.data.get("families", {})
    jobs: dict[str, tuple[str, tuple[float, ...], int]] = {}
    for family, stages in MPS_PAIR:
        # About `target_s` of training each at the rate measured alone, so that they overlap.
        measured = alone.get(family, {}).get("it_per_s") or 0.0
        jobs[f"gv-mps-{family}"] = (FAMILY_MODELS[family], stages,
                                    max(2 * iterations, int(measured * target_s)))
    n_cmds = len(cluster.commands)
    for job_id, (model, stages, total) in jobs.items():
        await cluster.submit(job_id, model, total, stages)
    res["iterations"] = {j: total for j, (_, _, total) in jobs.items()}
    # Both trainers training at once in runs launched as a group (a job that started alone
    # is stopped and relaunched with its partner: wait for the new runs, not the old). Which
    # run is which comes from the agent: a solo run can report its start after the grouped
    # launch was seen, while it is being stopped, so the records' times cannot tell.
    deadline = time.monotonic() + cap_s / 2
    current: dict[str, tuple[int, float]] = {}  # job → (grouped run's PID, first seen)
    while True:
        grouped = [(t, x) for t, c in cluster.commands[n_cmds:] for x in c.launches
                   if x.job_id in jobs and len(x.colocated) > 1]
        since = min((t for t, _ in grouped), default=math.inf)
        now = time.monotonic()
        for j in jobs:
            pid = cluster.tap.grouped_pid(j)
            if pid is None:
                current.pop(j, None)
            elif current.get(j, (None, 0.0))[0] != pid:
                current[j] = (pid, now)
        # Polled far more often than a trainer starts, so its start record comes after.
        pids = {j: pid for j, (pid, _) in current.items()}
        if len(current) == len(jobs) and all(
                _trains_since(cluster.tap, j, max(since, current[j][1])) for j in jobs):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pair did not train co-located (launches with partners: "
                               f"{[(x.job_id, x.colocated) for _, x in grouped]}, trainers: "
                               f"{pids}, records: {[cluster.tap.of(j)[-1:] for j in jobs]})")
        await asyncio.sleep(0.2)
    # From the grouped launch to its trainers' start: the agent starts the MPS daemon first.
    spawned = {j: max(since, seen) for j, (_, seen) in current.items()}  # the grouped runs
    res["grouped_launch_to_started_s"] = {
        j: round(next(t for t, r in cluster.tap.records[j]
                      if t >= spawned[j] and r["event"] == "started") - since, 2) for j in jobs}
    res["trainer_env"] = {j: process_env(pid) for j, pid in pids.items() if j in jobs}
    res["mps_processes"] = {str(k): v for k, v in mps_processes().items()}
    await asyncio.sleep(1.0)  # a telemetry sample with both trainers on the GPU
    res["gpu_processes"] = gpu_processes(cluster)
    for j, env in res["trainer_env"].items():
        report.measure(f"{j} CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                       env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
    report.measure("MPS daemon/server processes", ", ".join(res["mps_processes"].values())
                   or "none")
    rows = await cluster.wait_terminal(list(jobs), cap_s / 2)
    await cluster.cancel_unfinished(rows, list(jobs), report)
    res["launches"] = [{"job": x.job_id, "colocated": list(x.colocated), "cycle": c.cycle}
                       for _, c in cluster.commands[n_cmds:] for x in c.launches
                       if x.job_id in jobs]
    res["stops"] = [{"job": s.job_id, "reason": s.reason, "cycle": c.cycle}
                    for _, c in cluster.commands[n_cmds:] for s in c.stops if s.job_id in jobs]
    # Iterations/s while both trained: the overlap of the progress of their grouped runs (a
    # job whose partner finished is relaunched alone: that run is not counted).
    grouped_runs = {j: next((r for r in runs_of(cluster.tap.records.get(j, []))
                             if r.t_started >= spawned[j]), None) for j in jobs}
    spans = [(r.progress[0]["ts"], r.progress[-1]["ts"])
             for r in grouped_runs.values() if r is not None and r.progress]
    lo, hi = (max(s[0] for s in spans), min(s[1] for s in spans)) if len(spans) == 2 else (0, 0)
    res["overlap_s"] = round(max(0.0, hi - lo), 2)
    both = [s for s in cluster.samples
            if "telemetry" in s and all(j in s["trainers"] for j in jobs)]
    res["max_utilization_colocated"] = max(
        (t["utilization"] for s in both for t in s["telemetry"]), default=None)
    res["jobs"] = {}
    for j in jobs:
        family = j.removeprefix("gv-mps-")
        result = job_result(cluster, j, rows.get(j, {}))
        run = grouped_runs[j]
        result["device_colocated"] = run.started.get("device") if run else None
        result["it_per_s_colocated"] = rate(run.progress, lo, hi) if run and hi > lo else None
        result["it_per_s_alone"] = alone.get(family, {}).get("it_per_s")
        if result["it_per_s_colocated"] and result["it_per_s_alone"]:
            result["colocated_over_alone"] = (result["it_per_s_colocated"]
                                              / result["it_per_s_alone"])
        res["jobs"][j] = result
        report.measure(f"{j} it/s alone → co-located",
                       f"{_fmt(result['it_per_s_alone'])} → "
                       f"{_fmt(result['it_per_s_colocated'])} "
                       f"(×{_fmt(result.get('colocated_over_alone'))}, {result['state']}, "
                       f"{result['device_colocated']})")
        if real and str(result["device_colocated"]).startswith("cpu"):
            report.finding(f"{j} trained on the CPU under MPS (CUDA unusable in the client?)")
    report.measure("co-located overlap (s) / max util while both ran",
                   f"{res['overlap_s']} / {_fmt(res['max_utilization_colocated'])}")
    report.measure("co-located launches / stops",
                   f"{len(res['launches'])} / {len(res['stops'])} "
                   f"({', '.join(s['job'] + ' ' + s['reason'] for s in res['stops'])})")
    logs = cluster.work / "mps" / NODE / "log"  # the agent's MpsControl.log_dir
    res["mps_logs"] = {p.name: p.read_text(errors="replace")[-3000:]
                       for p in sorted(logs.glob("*.log"))}
    if any(r["state"] != "finished" for r in res["jobs"].values()):
        raise RuntimeError("co-located jobs: " + ", ".join(
            f"{j}: {r['state']} {r.get('failure') or ''}" for j, r in res["jobs"].items()))
    pcts = {e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") for e in res["trainer_env"].values()}
    if pcts != {"50"}:
        raise RuntimeError(f"co-located trainers' active-thread percentages: {pcts}")


def _trains_since(tap: Tap, job_id: str, since: float) -> bool:
    """A run of `job_id` started after `since` (monotonic) and has reported progress."""
    started = False
    for t, rec in tap.records.get(job_id, []):
        if rec["event"] == "started":
            started = t >= since
        elif rec["event"] == "progress" and started:
            return True
    return False


def gpu_processes(cluster: Cluster) -> dict[str, Any]:
    """Who NVML says is on the GPUs now: telemetry's list, and its MPS-client list."""
    last = next((s for s in reversed(cluster.samples) if "telemetry" in s), None)
    procs = ({str(p): _comm(p) for t in last["telemetry"] for p in t["processes"]}
             if last else {})
    return {"telemetry_processes": procs, "mps_clients": nvml_mps_clients(cluster.probe)}


# -- main ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    iterations: int  # a family job's; the preempted and co-located jobs run twice as many
    family_cap_s: float
    preempt_cap_s: float
    mps_cap_s: float
    mps_target_s: float  # each co-located job runs about this long at its rate alone


def plan_for(real: bool, iterations: int | None) -> Plan:
    if real:  # the trainer's small models run a few hundred iterations a second on a GPU
        return Plan(iterations or 1500, 120.0, 75.0, 75.0, 10.0)
    return Plan(iterations or 60, 90.0, 60.0, 60.0, 2.0)


async def main_async(args: argparse.Namespace) -> int:
    real = args.fake_gpus is None
    report = Report("real" if real else f"fake ({args.fake_gpus} GPUs)", args.out)
    budget = Budget(args.budget_s)
    plan = plan_for(real, args.iterations)
    report.data["plan"] = {"iterations": plan.iterations, "budget_s": args.budget_s}
    work = Path(tempfile.mkdtemp(prefix="lgv-"))  # short: MPS pipe paths are Unix sockets
    report.data["work_dir"] = str(work)

    async def env_step() -> None:
        env = await asyncio.to_thread(environment)
        report.data["environment"] = env
        for key in ("nvidia_smi_L", "nvidia_smi_query", "torch", "torch_cuda", "cuda_available",
                    "device_name", "nccl", "mps_control", "nvidia_ml_py"):
            report.measure(key, env.get(key))
        for key in ("cuda_error", "nccl_error", "torch_probe_error"):
            if env.get(key):
                report.measure(key, env[key])

    await run_step(report, budget, "environment", 150, env_step)

    async def doctor_step() -> None:
        report.data["doctor"] = await asyncio.to_thread(doctor, work, args.fake_gpus)
        for check in report.data["doctor"].get("checks", []):
            gpu = "" if check.get("gpu") is None else f"_gpu{check['gpu']}"
            report.measure(f"doctor_{check.get('check')}{gpu}",
                           f"{check.get('status')}: {check.get('measured', '')}")

    await run_step(report, budget, "doctor", 60, doctor_step)
    mps_binary = find_mps_control(report)

    backend: GpuBackend | None = None

    async def backend_step() -> None:
        nonlocal backend
        backend = await asyncio.to_thread(make_backend, args.fake_gpus, report)
        await gpu_step(backend, report, work, real)

    await run_step(report, budget, "gpu_backend", 150, backend_step)
    started: list[Cluster] = []
    cluster: Cluster | None = None
    try:
        async def cluster_step() -> None:
            nonlocal cluster
            probe = backend if backend is not None else FakeBackend(0)
            gpus = args.fake_gpus if not real else len(probe.discover())
            cluster = await start_cluster(work, args.fake_gpus, max(1, gpus), report, probe,
                                          started)

        up = await run_step(report, budget, "cluster", 90, cluster_step)
        no_cluster = None if up and cluster is not None else "the cluster did not start"

        async def families() -> None:
            assert cluster is not None
            await families_step(cluster, report, plan.iterations, plan.family_cap_s, real)

        async def preempt() -> None:
            assert cluster is not None
            await preemption_step(cluster, report, plan.iterations, plan.preempt_cap_s)

        async def mps() -> None:
            assert cluster is not None
            await mps_step(cluster, report, plan.iterations, plan.mps_cap_s, plan.mps_target_s,
                           real)

        await run_step(report, budget, "families", plan.family_cap_s + 10, families,
                       skip=no_cluster)
        await run_step(report, budget, "preemption", plan.preempt_cap_s + 10, preempt,
                       skip=no_cluster)
        no_mps = no_cluster or (None if mps_binary or not real
                                else "nvidia-cuda-mps-control is not on PATH")
        await run_step(report, budget, "mps", plan.mps_cap_s + 10, mps, skip=no_mps)
    finally:
        TERMINATION.tearing_down = True  # a SIGTERM from now on is noted, not obeyed
        groups = {"self": process_group(os.getpid()),
                  **{f"{pid} {name}": process_group(pid) for pid, name in mps_processes().items()}}
        report.data.setdefault("teardown", {})["process_groups"] = groups
        for half in started:  # the cluster, or what of it started before a failure
            print("== teardown", flush=True)
            try:
                await asyncio.wait_for(stop_cluster(half, report), TEARDOWN_S + 60)
            except (Exception, asyncio.CancelledError) as exc:
                report.finding(f"teardown: {type(exc).__name__}: {exc}")
        for when, phase in TERMINATION.received:
            report.finding(f"SIGTERM received {when - report.started:.1f} s in, during {phase}")
        if real and mps_processes():
            report.finding(f"MPS processes still running after the agent stopped: "
                           f"{mps_processes()}")
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.close()
        shutil.rmtree(work, ignore_errors=True)
        path = report.write()
        print_summary(report)
        print(f"wrote {path}", flush=True)
    ran = [s for s in report.steps.values() if not s.get("skipped")]
    return 0 if ran and all(s["ok"] for s in ran) else 1


def print_summary(report: Report) -> None:
    print(f"\n== summary ({report.mode}, {time.monotonic() - report.started:.0f} s)")
    width = max((len(w) for w, _ in report.summary), default=10)
    for name, step in report.steps.items():
        status = "ok" if step["ok"] else ("skipped: " + step["skipped"] if step.get("skipped")
                                          else "FAILED: " + str(step.get("error")))
        print(f"  step {name:<{width - 5}}  {status}")
    print()
    for what, value in report.summary:
        print(f"  {what:<{width}}  {value}")
    for text in report.findings:
        print(f"  FINDING: {text}")
    sys.stdout.flush()


@dataclass
class Termination:
    tearing_down: bool = False
    received: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, phase)


TERMINATION = Termination()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    default_out = os.environ.get("OUT") or "gpu_validation_out"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fake-gpus", type=int, default=None, metavar="N",
                   help="N fake GPUs (FakeBackend) and CPU training: this script's own test")
    p.add_argument("--out", type=Path, default=Path(default_out),
                   help="where gpu_validation.json goes (default $OUT, else %(default)s)")
    p.add_argument("--budget-s", type=float, default=280.0,
                   help="wall-clock budget for all steps; later steps are skipped past it")
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations of a family job (default 1500 on GPUs, 60 with fake ones)")
    args = p.parse_args(argv)
    if args.fake_gpus is not None and args.fake_gpus < 1:
        p.error("--fake-gpus must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from services.runtime.logging import configure
    configure("warning")  # the agent's spawn failures and telemetry warnings, on stderr
    loop = asyncio.new_event_loop()
    task = loop.create_task(main_async(args))

    # SIGTERM (a `timeout` around the run) cancels the steps; teardown and the report follow.
    # One arriving during teardown is only recorded: the report says who was still running.
    def on_sigterm() -> None:
        phase = "teardown" if TERMINATION.tearing_down else "the steps"
        TERMINATION.received.append((time.monotonic(), phase))
        if not TERMINATION.tearing_down:
            task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        return 1
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
