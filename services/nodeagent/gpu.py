"""GPU backends for the node agent: discovery, telemetry, topology and MPS control.

One interface, `GpuBackend`, three implementations:
- `NvmlBackend`: NVIDIA's NVML through nvidia-ml-py (`pynvml`), imported when first used so
  that machines without a GPU never need the package;
- `DcgmBackend`: NVML for discovery and topology, DCGM's field API for telemetry, when DCGM's
  Python bindings are importable (they ship with NVIDIA's datacenter-gpu-manager package under
  /usr/local/dcgm/bindings/python3, or `DCGMPATH`); `detect_backend` falls back to NVML;
- `FakeBackend`: K GPUs of a named type that exist only in memory and record every command,
  for tests and `--fake-gpus` on machines without GPUs.

MPS (co-located jobs, Muri's interleaving) is driven through `nvidia-cuda-mps-control`, whose
commands go in on stdin; `MpsControl` builds the commands and runs them through a `Runner`,
so the fake records exactly what a GPU node would execute.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

LinkKind = Literal["nvlink", "pcie-switch", "pcie-host", "system"]
# NVML's nvmlGpuTopologyLevel_t → how two GPUs talk (nearest first); NVLink is checked apart.
_NVML_LEVEL: dict[int, LinkKind] = {0: "pcie-switch", 10: "pcie-switch", 20: "pcie-switch",
                                    30: "pcie-host", 40: "system", 50: "system"}
DCGM_DEFAULT_PATH = "/usr/local/dcgm/bindings/python3"


class GpuBackendError(RuntimeError):
    """The GPU layer cannot do what was asked (no driver, no bindings, a failed command)."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    uuid: str
    utilization_ratio: float  # 0..1, SM busy over the driver's sample period
    memory_used_bytes: int
    processes: tuple[int, ...]  # PIDs with a compute context on the GPU


@dataclass(frozen=True, slots=True)
class GpuLink:
    a: str  # GPU UUIDs, a < b
    b: str
    kind: LinkKind


class GpuBackend(Protocol):
    name: str

    def discover(self) -> list[GpuInfo]: ...

    def telemetry(self) -> list[GpuTelemetry]: ...

    def topology(self) -> list[GpuLink]: ...

    def close(self) -> None: ...


# -- NVML ------------------------------------------------------------------------------------
def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise GpuBackendError(
            "NVML backend needs nvidia-ml-py: pip install 'loom-scheduler[gpu]'") from exc
    return pynvml


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise GpuBackendError(f"NVML could not start: {exc}") from exc
        self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i)
                         for i in range(self._nvml.nvmlDeviceGetCount())]

    def discover(self) -> list[GpuInfo]:
        n = self._nvml
        return [GpuInfo(index=i, uuid=_text(n.nvmlDeviceGetUUID(h)),
                        name=_text(n.nvmlDeviceGetName(h)),
                        memory_bytes=int(n.nvmlDeviceGetMemoryInfo(h).total),
                        pci_bus_id=_text(n.nvmlDeviceGetPciInfo(h).busId))
                for i, h in enumerate(self._handles)]

    def telemetry(self) -> list[GpuTelemetry]:
        n = self._nvml
        out = []
        for h in self._handles:
            procs = n.nvmlDeviceGetComputeRunningProcesses(h)
            out.append(GpuTelemetry(
                uuid=_text(n.nvmlDeviceGetUUID(h)),
                utilization_ratio=n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                memory_used_bytes=int(n.nvmlDeviceGetMemoryInfo(h).used),
                processes=tuple(int(p.pid) for p in procs)))
        return out

    def topology(self) -> list[GpuLink]:
        n = self._nvml
        gpus = self.discover()
        bus_of = {g.uuid: g.pci_bus_id for g in gpus}
        links = []
        for i, hi in enumerate(self._handles):
            peers = self._nvlink_peers(hi)
            for j in range(i + 1, len(self._handles)):
                if bus_of[gpus[j].uuid] in peers:
                    kind: LinkKind = "nvlink"
                else:
                    level = int(n.nvmlDeviceGetTopologyCommonAncestor(hi, self._handles[j]))
                    kind = _NVML_LEVEL.get(level, "system")
                a, b = sorted((gpus[i].uuid, gpus[j].uuid))
                links.append(GpuLink(a, b, kind))
        return links

    def _nvlink_peers(self, handle: Any) -> set[str]:
        """PCI bus ids at the far end of this GPU's active NVLinks."""
        n = self._nvml
        peers = set()
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if n.nvmlDeviceGetNvLinkState(handle, link):
                    peers.add(_text(n.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except n.NVMLError:
                break  # no more links on this GPU (or no NVLink at all)
        return peers

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- DCGM ------------------------------------------------------------------------------------
def import_dcgm(path: str | None = None) -> Any:
    """DCGM's Python bindings (`pydcgm`), from `path`, `DCGMPATH` or NVIDIA's install dir."""
    where = path or os.environ.get("DCGMPATH") or DCGM_DEFAULT_PATH
    if where not in sys.path and Path(where).is_dir():
        sys.path.append(where)
    try:
        import pydcgm
    except ImportError as exc:
        raise GpuBackendError(f"DCGM bindings not found in {where} (pydcgm)") from exc
    return pydcgm


class DcgmBackend(NvmlBackend):
    """NVML for what the GPUs are, DCGM's watched fields for how busy they are."""

    name = "dcgm"
    # dcgm_fields: DCGM_FI_DEV_GPU_UTIL (203), DCGM_FI_DEV_FB_USED (252, MiB)
    FIELDS = (203, 252)

    def __init__(self, nvml: Any | None = None, dcgm: Any | None = None) -> None:
        # The bindings first: where they are missing, NVML is not left initialised.
        self._dcgm = dcgm if dcgm is not None else import_dcgm()
        super().__init__(nvml)
        handle = None
        try:
            handle = self._dcgm.DcgmHandle(ipAddress="127.0.0.1")
            group = handle.GetSystem().GetDefaultGroup()
            self._fields = self._dcgm.DcgmFieldGroup(handle, name="loom",
                                                     fieldIds=list(self.FIELDS))
            group.samples.WatchFields(self._fields, 1_000_000, 60.0, 0)
        except Exception as exc:
            # The bindings raise their own DCGMError types (no nv-hostengine running, say);
            # as GpuBackendError, `detect_backend("auto")` falls back to NVML.
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.Shutdown()
            self._nvml.nvmlShutdown()
            raise GpuBackendError(f"DCGM could not start: {type(exc).__name__}: {exc}") from exc
        self._handle = handle
        self._group = group

    def telemetry(self) -> list[GpuTelemetry]:
        latest = self._group.samples.GetLatest_v2(self._fields).values
        procs = {t.uuid: t.processes for t in super().telemetry()}
        out = []
        for info in self.discover():
            fields = latest.get(info.index, {})
            util = _last(fields.get(self.FIELDS[0]))
            used_mib = _last(fields.get(self.FIELDS[1]))
            out.append(GpuTelemetry(info.uuid, util / 100.0, int(used_mib) * 1024 * 1024,
                                    procs.get(info.uuid, ())))
        return out

    def close(self) -> None:
        self._handle.Shutdown()
        super().close()


def _last(samples: Any) -> float:
    return float(samples[-1].value) if samples else 0.0


def detect_backend(prefer: str = "auto") -> GpuBackend:
    """`dcgm`, `nvml` or `auto` (DCGM when its bindings import, else NVML)."""
    if prefer == "nvml":
        return NvmlBackend()
    if prefer == "dcgm":
        return DcgmBackend()
    if prefer != "auto":
        raise GpuBackendError(f"unknown GPU backend {prefer!r}; use auto, dcgm or nvml")
    try:
        return DcgmBackend()
    except GpuBackendError:
        return NvmlBackend()


# -- the fake ---------------------------------------------------------------------------------
@dataclass
class FakeBackend:
    """`count` GPUs of `gpu_type` in memory; `commands` records every call, in order."""

    count: int
    gpu_type: str = "fake"
    node: str = "node"
    name: str = "fake"
    commands: list[tuple[str, ...]] = field(default_factory=list)
    busy: dict[str, tuple[int, ...]] = field(default_factory=dict)  # uuid → PIDs on it

    def __post_init__(self) -> None:
        if self.count < 0:
            raise GpuBackendError(f"fake GPU count must be ≥ 0, not {self.count}")

    def uuid(self, index: int) -> str:
        return f"GPU-fake-{self.node}-{index}"

    def discover(self) -> list[GpuInfo]:
        self.commands.append(("discover",))
        return [GpuInfo(i, self.uuid(i), f"Fake {self.gpu_type}", 16 << 30,
                        f"0000:{i:02x}:00.0") for i in range(self.count)]

    def telemetry(self) -> list[GpuTelemetry]:
        self.commands.append(("telemetry",))
        return [GpuTelemetry(self.uuid(i), 1.0 if self.busy.get(self.uuid(i)) else 0.0,
                             (8 << 30) if self.busy.get(self.uuid(i)) else 0,
                             self.busy.get(self.uuid(i), ())) for i in range(self.count)]

    def topology(self) -> list[GpuLink]:
        """Pairs (0,1), (2,3)… on NVLink, the rest across the host bridge (a DGX-like box)."""
        self.commands.append(("topology",))
        return [GpuLink(self.uuid(i), self.uuid(j), "nvlink" if i // 2 == j // 2 else
                        "pcie-host")
                for i in range(self.count) for j in range(i + 1, self.count)]

    def run(self, argv: Sequence[str], stdin: str = "") -> str:
        """The `Runner` for MPS: records the command instead of executing it."""
        self.commands.append((*argv, stdin.strip()) if stdin else tuple(argv))
        return ""

    def close(self) -> None:
        self.commands.append(("close",))


# -- MPS --------------------------------------------------------------------------------------
Runner = Callable[[Sequence[str], str], str]  # (argv, stdin) → stdout


def run_command(argv: Sequence[str], stdin: str = "") -> str:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuBackendError(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise GpuBackendError(f"{' '.join(argv)} exited {done.returncode}: "
                              f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass
class MpsControl:
    """The MPS control daemon of one node (NVIDIA's MPS docs, 'Tools and Interface')."""

    pipe_dir: Path
    log_dir: Path
    run: Runner = run_command
    binary: str = "nvidia-cuda-mps-control"
    started: bool = False

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _control(self, command: str) -> str:
        # The control binary reads its pipe location from the environment; pass it as `env`
        # arguments so the runner (and the fake's record) sees the whole command.
        argv = ["env", *(f"{k}={v}" for k, v in self.env.items()), self.binary]
        return self.run(argv, command + "\n")

    def start(self) -> None:
        if self.started:
            return
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = ["env", *(f"{k}={v}" for k, v in self.env.items()), self.binary, "-d"]
        self.run(argv, "")
        self.started = True

    def stop(self) -> None:
        if self.started:
            self._control("quit")
            self.started = False

    def client_env(self, active_thread_percentage: int) -> dict[str, str]:
        """Environment of a job sharing GPUs through MPS, capped to a share of the SMs."""
        if not 1 <= active_thread_percentage <= 100:
            raise GpuBackendError(
                f"active thread percentage must be 1..100, not {active_thread_percentage}")
        return {**self.env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(active_thread_percentage)}

    def set_default_active_thread_percentage(self, pct: int) -> None:
        self.client_env(pct)  # validates
        self._control(f"set_default_active_thread_percentage {pct}")
