"""What the harness reads of the host: its environment, `loom doctor`, /proc and NVML."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from services.nodeagent.gpu import GpuBackend, GpuTelemetry

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


# -- GPUs and processes, as NVML and /proc show them --------------------------------------
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


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat from field 3 (state) on: what follows the command name, which may hold
    spaces. Raises OSError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


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
            started = int(stat_fields(int(entry.name))[19])  # field 22: start time
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
        fields = stat_fields(pid)
    except OSError as exc:
        return str(exc)
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
