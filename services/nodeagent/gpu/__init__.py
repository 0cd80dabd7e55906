"""GPU backends for the node agent: discovery, telemetry, topology and MPS control.

One interface, `GpuBackend` (`interface`), three implementations:
- `NvmlBackend` (`nvml`): NVIDIA's NVML through nvidia-ml-py (`pynvml`), imported when first
  used so that machines without a GPU never need the package;
- `DcgmBackend` (`nvml`): NVML for discovery and topology, DCGM's field API for telemetry,
  when DCGM's Python bindings are importable (they ship with NVIDIA's datacenter-gpu-manager
  package under /usr/local/dcgm/bindings/python3, or `DCGMPATH`); `detect_backend` falls back
  to NVML;
- `FakeBackend` (`fake`): K GPUs of a named type that exist only in memory and record every
  command, for tests and `--fake-gpus` on machines without GPUs; `FakeFaults` make it (and
  the doctor's other probes, `services.nodeagent.probes`) report each failure `loom doctor`
  checks for (`--fake-faults`, `LOOM_FAKE_FAULTS`).

Besides discovery, telemetry and topology, a backend reports what the health checks read
(`driver`, `health`: ECC counters, retired pages and row remapping, XID events, temperature
against its thresholds, throttling reasons), so `loom doctor` and the node agent's checks on
every heartbeat go through the interface the agent uses, and the fake can fail each of them.

MPS (co-located jobs, Muri's interleaving) is driven through `nvidia-cuda-mps-control`, whose
commands go in on stdin; `MpsControl` (`mps`) builds the commands and runs them through a `Runner`,
so the fake records exactly what a GPU node would execute.
"""

from __future__ import annotations

from services.nodeagent.gpu.fake import FAKE_DRIVER, FAULTS_ENV, FakeBackend, FakeFaults
from services.nodeagent.gpu.interface import (
    THROTTLE_BAD,
    THROTTLE_REASONS,
    DriverInfo,
    GpuBackend,
    GpuBackendError,
    GpuHealth,
    GpuInfo,
    GpuLink,
    GpuTelemetry,
    LinkKind,
)
from services.nodeagent.gpu.mps import MpsControl, Runner, run_command
from services.nodeagent.gpu.nvml import DcgmBackend, NvmlBackend, detect_backend, import_dcgm

__all__ = [
    "FAKE_DRIVER", "FAULTS_ENV", "THROTTLE_BAD", "THROTTLE_REASONS", "DcgmBackend", "DriverInfo",
    "FakeBackend", "FakeFaults", "GpuBackend", "GpuBackendError", "GpuHealth", "GpuInfo",
    "GpuLink", "GpuTelemetry", "LinkKind", "MpsControl", "NvmlBackend", "Runner",
    "detect_backend", "import_dcgm", "run_command",
]
