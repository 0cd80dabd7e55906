"""GPU backends for the node agent: discovery, telemetry, topology and MPS control.

One interface, `GpuBackend`, three implementations:
- `NvmlBackend`: NVIDIA's NVML through nvidia-ml-py (`pynvml`), imported when first used so
  that machines without a GPU never need the package;
- `DcgmBackend`: NVML for discovery and topology, DCGM's field API for telemetry, when DCGM's
  Python bindings are importable (they ship with NVIDIA's datacenter-gpu-manager package under
  /usr/local/dcgm/bindings/python3, or `DCGMPATH`); `detect_backend` falls back to NVML;
- `FakeBackend`: K GPUs of a named type that exist only in memory and record every command,
  for tests and `--fake-gpus` on machines without GPUs; `FakeFaults` make it (and the
  doctor's other probes, `services.nodeagent.probes`) report each failure `loom doctor`
  checks for (`--fake-faults`, `LOOM_FAKE_FAULTS`).

Besides discovery, telemetry and topology, a backend reports what the health checks read
(`driver`, `health`: ECC counters, retired pages and row remapping, XID events, temperature
against its thresholds, throttling reasons), so `loom doctor` and the node agent's checks on
every heartbeat go through the interface the agent uses, and the fake can fail each of them.

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


@dataclass(frozen=True, slots=True)
class DriverInfo:
    driver_version: str  # e.g. 550.54.15
    cuda_version: str  # the newest CUDA the driver runs, e.g. 12.4
    nvml_version: str


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """What the health checks read of one GPU; None: the GPU does not report it (no ECC on
    a consumer card, no row remapping before Ampere), `errors`: reads that failed."""

    index: int
    uuid: str
    lost: str | None = None  # the GPU stopped answering (fell off the bus, needs a reset)
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None  # the ECC mode changes at the next reboot
    ecc_uncorrected: int | None = None  # volatile: since the driver last loaded
    ecc_corrected: int | None = None
    retired_pages: int | None = None  # pages retired for ECC errors (before Ampere)
    retired_pending: bool | None = None  # a retirement waits for a reboot
    remapped_rows: tuple[int, int] | None = None  # (correctable, uncorrectable); Ampere on
    remap_pending: bool | None = None  # a remap waits for a GPU reset
    remap_failed: bool | None = None  # a row could not be remapped: replace the GPU
    xids: tuple[int, ...] = ()  # XID errors seen since the backend started watching
    xid_watch: str | None = None  # why XIDs cannot be watched (None: they are)
    temperature_c: int | None = None
    slowdown_c: int | None = None  # the driver slows the GPU down from here
    shutdown_c: int | None = None  # and shuts it down from here
    throttle_reasons: int | None = None  # NVML's clocks event reasons, a bit mask
    errors: tuple[str, ...] = ()


# NVML's nvmlClocksEventReason* (nvmlClocksThrottleReason* before 12.535) bits.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "idle", 0x2: "application clocks", 0x4: "software power cap",
    0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown", 0x80: "hardware power brake", 0x100: "display clock",
}
# Reasons that mean the GPU runs slower than it should (not idle, not a setting).
THROTTLE_BAD = 0x8 | 0x20 | 0x40 | 0x80


class GpuBackend(Protocol):
    name: str

    def discover(self) -> list[GpuInfo]: ...

    def telemetry(self) -> list[GpuTelemetry]: ...

    def topology(self) -> list[GpuLink]: ...

    def driver(self) -> DriverInfo: ...

    def health(self) -> list[GpuHealth]: ...

    def close(self) -> None: ...


# -- NVML ------------------------------------------------------------------------------------
def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise GpuBackendError(
            "NVML backend needs nvidia-ml-py: pip install 'loom-scheduler[gpu]'") from exc
    return pynvml


# nvmlReturn_t codes the health reads tell apart (pynvml's NVMLError.value).
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT, NVML_ERROR_FUNCTION_NOT_FOUND = 3, 10, 13
NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED = 15, 16
_NOT_REPORTED = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)
_GONE = (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED)
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
XIDS_KEPT = 64  # per GPU, the latest


class _Lost(Exception):
    """The GPU stopped answering NVML (lost from the bus, or it needs a reset)."""


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
        # XID events: watched from the first health read on (NVML reports none from before).
        self._events: Any = None
        self._xid_watch: dict[int, str] = {}  # GPU → why its XIDs are not watched
        self._xids: dict[int, list[int]] = {}

    def driver(self) -> DriverInfo:
        n = self._nvml
        try:
            cuda = int(n.nvmlSystemGetCudaDriverVersion())
            return DriverInfo(driver_version=_text(n.nvmlSystemGetDriverVersion()),
                              cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
                              nvml_version=_text(n.nvmlSystemGetNVMLVersion()))
        except n.NVMLError as exc:
            raise GpuBackendError(f"NVML does not answer: {exc}") from exc

    def health(self) -> list[GpuHealth]:
        """Each GPU's ECC counters, retired pages or remapped rows, XIDs since the first
        call, temperature with its thresholds and throttling reasons. A read the GPU does not
        support is None; one that fails otherwise is in `errors`; a GPU that no longer
        answers is `lost`."""
        self._watch_xids()
        return [self._gpu_health(i, h) for i, h in enumerate(self._handles)]

    def _gpu_health(self, index: int, h: Any) -> GpuHealth:
        n = self._nvml
        errors: list[str] = []

        def ask(what: str, fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except n.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code in _GONE:
                    raise _Lost(str(exc)) from exc
                if code not in _NOT_REPORTED:
                    errors.append(f"{what}: {exc}")
                return None

        try:
            uuid = _text(ask("UUID", n.nvmlDeviceGetUUID, h) or f"GPU #{index}")
            mode = ask("ECC mode", n.nvmlDeviceGetEccMode, h)
            enabled = None if mode is None else bool(mode[0])
            pending = None if mode is None else bool(mode[1]) != bool(mode[0])
            unc = cor = None
            if enabled:
                volatile = getattr(n, "NVML_VOLATILE_ECC", 0)
                unc = ask("ECC errors", n.nvmlDeviceGetTotalEccErrors, h,
                          getattr(n, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), volatile)
                cor = ask("ECC errors", n.nvmlDeviceGetTotalEccErrors, h,
                          getattr(n, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), volatile)
            retired = retired_pending = None
            sbe = ask("retired pages", n.nvmlDeviceGetRetiredPages, h,
                      getattr(n, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0))
            dbe = ask("retired pages", n.nvmlDeviceGetRetiredPages, h,
                      getattr(n, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
            if sbe is not None or dbe is not None:
                retired = len(list(sbe or ())) + len(list(dbe or ()))
                state = ask("retired pages", n.nvmlDeviceGetRetiredPagesPendingStatus, h)
                retired_pending = None if state is None else bool(state)
            rows = ask("row remapping", n.nvmlDeviceGetRemappedRows, h)
            temp = ask("temperature", n.nvmlDeviceGetTemperature, h,
                       getattr(n, "NVML_TEMPERATURE_GPU", 0))
            slowdown = ask("temperature", n.nvmlDeviceGetTemperatureThreshold, h,
                           getattr(n, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1))
            shutdown = ask("temperature", n.nvmlDeviceGetTemperatureThreshold, h,
                           getattr(n, "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0))
            reasons_of = (getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
                          or n.nvmlDeviceGetCurrentClocksThrottleReasons)
            reasons = ask("throttling", reasons_of, h)
        except _Lost as exc:
            return GpuHealth(index=index, uuid=f"GPU #{index}", lost=str(exc))
        return GpuHealth(
            index=index, uuid=uuid, ecc_enabled=enabled, ecc_pending=pending,
            ecc_uncorrected=None if unc is None else int(unc),
            ecc_corrected=None if cor is None else int(cor),
            retired_pages=retired, retired_pending=retired_pending,
            remapped_rows=None if rows is None else (int(rows[0]), int(rows[1])),
            remap_pending=None if rows is None else bool(rows[2]),
            remap_failed=None if rows is None else bool(rows[3]),
            xids=tuple(self._xids.get(index, ())), xid_watch=self._xid_watch.get(index),
            temperature_c=None if temp is None else int(temp),
            slowdown_c=None if slowdown is None else int(slowdown),
            shutdown_c=None if shutdown is None else int(shutdown),
            throttle_reasons=None if reasons is None else int(reasons),
            errors=tuple(errors))

    def _watch_xids(self) -> None:
        """Register for XID events once, then collect those that came since the last call."""
        n = self._nvml
        if self._events is None:
            try:
                self._events = n.nvmlEventSetCreate()
            except n.NVMLError as exc:
                self._xid_watch = {i: f"no NVML event set: {exc}"
                                   for i in range(len(self._handles))}
                self._events = False
                return
            for i, h in enumerate(self._handles):
                try:
                    n.nvmlDeviceRegisterEvents(h, getattr(n, "nvmlEventTypeXidCriticalError",
                                                          XID_EVENT), self._events)
                except n.NVMLError as exc:
                    self._xid_watch[i] = f"XID events not available: {exc}"
        if self._events is False:
            return
        while True:
            try:
                event = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError as exc:
                if getattr(exc, "value", None) != NVML_ERROR_TIMEOUT:  # timeout: none left
                    for i in range(len(self._handles)):
                        self._xid_watch.setdefault(i, f"XID events unreadable: {exc}")
                return
            try:
                index = int(n.nvmlDeviceGetIndex(event.device))
            except n.NVMLError:
                continue
            seen = self._xids.setdefault(index, [])
            seen.append(int(event.eventData))
            del seen[:-XIDS_KEPT]

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
        if self._events:
            with contextlib.suppress(Exception):
                self._nvml.nvmlEventSetFree(self._events)
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
FAKE_DRIVER = DriverInfo(driver_version="550.54.15", cuda_version="12.4",
                         nvml_version="12.550.54.15")
FAKE_SLOWDOWN_C, FAKE_SHUTDOWN_C = 87, 92


@dataclass(frozen=True)
class FakeFaults:
    """What a fake node pretends is wrong, one field per failure `loom doctor` looks for.

    Written as `parse("ecc_uncorrectable=1,xid=1:79,no_dcgm,skew=30")` (`--fake-faults`,
    `LOOM_FAKE_FAULTS`); GPU faults name the GPU's index, then `:` and a value. `FAULTS`
    lists every name with what it does.
    """

    no_nvml: bool = False
    missing: int = 0  # GPUs fewer than asked for are visible
    lost: frozenset[int] = frozenset()  # GPUs that fell off the bus
    ecc_uncorrectable: tuple[tuple[int, int], ...] = ()  # (GPU, volatile errors)
    ecc_off: frozenset[int] = frozenset()
    remap_failed: frozenset[int] = frozenset()
    remap_pending: frozenset[int] = frozenset()
    xids: tuple[tuple[int, int], ...] = ()  # (GPU, XID)
    temperature: tuple[tuple[int, int], ...] = ()  # (GPU, °C)
    throttle: tuple[tuple[int, int], ...] = ()  # (GPU, NVML reasons mask)
    no_dcgm: bool = False
    no_torch: bool = False
    no_cuda: bool = False  # torch without CUDA
    torch_cuda: str | None = None  # the CUDA torch was built for (newer than the driver's?)
    no_nccl: bool = False
    no_gloo: bool = False
    mps: bool = False  # the MPS control daemon does not start
    checkpoint_readonly: bool = False
    checkpoint_free: int | None = None  # bytes free where checkpoints go
    nats: bool = False  # the NATS server cannot be reached
    skew_s: float = 0.0  # this node's clock minus the NATS server's

    @classmethod
    def parse(cls, text: str) -> FakeFaults:
        """Faults from `name[=value]` items, comma-separated (ValueError naming a bad one)."""
        fields: dict[str, Any] = {}
        for item in (t.strip() for t in text.split(",")):
            if not item:
                continue
            name, _, value = item.partition("=")
            spec = FAULTS.get(name.strip())
            if spec is None:
                raise ValueError(f"unknown fake fault {name!r}; known: {', '.join(FAULTS)}")
            try:
                spec[0](fields, value.strip())
            except (ValueError, IndexError) as exc:
                raise ValueError(f"fake fault {item!r}: {spec[1]} ({exc})") from None
        return cls(**fields)

    def gpu_value(self, pairs: tuple[tuple[int, int], ...], gpu: int) -> int | None:
        return next((v for g, v in reversed(pairs) if g == gpu), None)


def _flag(key: str) -> Callable[[dict[str, Any], str], None]:
    def set_(fields: dict[str, Any], value: str) -> None:
        if value:
            raise ValueError("takes no value")
        fields[key] = True
    return set_


def _gpus(key: str) -> Callable[[dict[str, Any], str], None]:
    def add(fields: dict[str, Any], value: str) -> None:
        fields[key] = frozenset(fields.get(key, frozenset()) | {_index(value)})
    return add


def _gpu_values(key: str, default: int | None) -> Callable[[dict[str, Any], str], None]:
    def add(fields: dict[str, Any], value: str) -> None:
        gpu, _, amount = value.partition(":")
        if not amount and default is None:
            raise ValueError("needs GPU:VALUE")
        number = int(amount, 0) if amount else default
        fields[key] = (*fields.get(key, ()), (_index(gpu), number))
    return add


def _index(text: str) -> int:
    gpu = int(text)
    if gpu < 0:
        raise ValueError("a GPU index is ≥ 0")
    return gpu


def _number(key: str, kind: Callable[[str], Any]) -> Callable[[dict[str, Any], str], None]:
    def set_(fields: dict[str, Any], value: str) -> None:
        fields[key] = kind(value)
    return set_


def _bytes(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in units else ""
    return int(float(text[:len(text) - len(unit)]) * units[unit])


# name → (what sets it, what it means)
FAULTS: dict[str, tuple[Callable[[dict[str, Any], str], None], str]] = {
    "no_nvml": (_flag("no_nvml"), "the driver and NVML cannot be reached"),
    "missing": (_number("missing", int), "missing=K: K GPUs fewer are visible"),
    "lost": (_gpus("lost"), "lost=G: GPU G fell off the bus"),
    "ecc_uncorrectable": (_gpu_values("ecc_uncorrectable", 1),
                          "ecc_uncorrectable=G[:N]: N uncorrectable ECC errors on GPU G"),
    "ecc_off": (_gpus("ecc_off"), "ecc_off=G: ECC disabled on GPU G"),
    "remap_failed": (_gpus("remap_failed"), "remap_failed=G: a row remap failed on GPU G"),
    "remap_pending": (_gpus("remap_pending"),
                      "remap_pending=G: a row remap waits for GPU G's reset"),
    "xid": (_gpu_values("xids", None), "xid=G:X: XID X on GPU G"),
    "hot": (_gpu_values("temperature", FAKE_SHUTDOWN_C), "hot=G[:C]: GPU G at C °C"),
    "throttle": (_gpu_values("throttle", 0x40),
                 "throttle=G[:MASK]: GPU G throttled (default: hardware thermal slowdown)"),
    "no_dcgm": (_flag("no_dcgm"), "DCGM is not installed"),
    "no_torch": (_flag("no_torch"), "torch is not installed"),
    "no_cuda": (_flag("no_cuda"), "torch has no CUDA"),
    "torch_cuda": (_number("torch_cuda", str), "torch_cuda=V: torch built for CUDA V"),
    "no_nccl": (_flag("no_nccl"), "NCCL is not usable"),
    "no_gloo": (_flag("no_gloo"), "gloo is not usable"),
    "mps": (_flag("mps"), "the MPS control daemon does not start"),
    "checkpoint_readonly": (_flag("checkpoint_readonly"),
                            "the checkpoint directory is not writable"),
    "checkpoint_free": (_number("checkpoint_free", _bytes),
                        "checkpoint_free=SIZE: so much space free for checkpoints (e.g. 200M)"),
    "nats": (_flag("nats"), "the NATS server cannot be reached"),
    "skew": (_number("skew_s", float), "skew=S: this clock is S seconds off the server's"),
}
FAULTS_ENV = "LOOM_FAKE_FAULTS"


@dataclass
class FakeBackend:
    """`count` GPUs of `gpu_type` in memory; `commands` records every call, in order;
    `faults` (settable at any time) says what is wrong with them."""

    count: int
    gpu_type: str = "fake"
    node: str = "node"
    name: str = "fake"
    commands: list[tuple[str, ...]] = field(default_factory=list)
    busy: dict[str, tuple[int, ...]] = field(default_factory=dict)  # uuid → PIDs on it
    faults: FakeFaults = field(default_factory=FakeFaults)

    def __post_init__(self) -> None:
        if self.count < 0:
            raise GpuBackendError(f"fake GPU count must be ≥ 0, not {self.count}")

    def uuid(self, index: int) -> str:
        return f"GPU-fake-{self.node}-{index}"

    def _nvml(self) -> None:
        if self.faults.no_nvml:
            raise GpuBackendError("NVML could not start: Driver Not Loaded (fake fault no_nvml)")

    def discover(self) -> list[GpuInfo]:
        self.commands.append(("discover",))
        self._nvml()
        return [GpuInfo(i, self.uuid(i), f"Fake {self.gpu_type}", 16 << 30,
                        f"0000:{i:02x}:00.0")
                for i in range(max(0, self.count - self.faults.missing))]

    def driver(self) -> DriverInfo:
        self.commands.append(("driver",))
        self._nvml()
        return FAKE_DRIVER

    def health(self) -> list[GpuHealth]:
        self.commands.append(("health",))
        self._nvml()
        f = self.faults
        out = []
        for i in range(max(0, self.count - f.missing)):
            if i in f.lost:
                out.append(GpuHealth(index=i, uuid=self.uuid(i),
                                     lost="GPU is lost (fake fault lost)"))
                continue
            ecc = i not in f.ecc_off
            rows = (0, 0) if i not in f.remap_failed else (0, 1)
            out.append(GpuHealth(
                index=i, uuid=self.uuid(i), ecc_enabled=ecc, ecc_pending=False,
                ecc_uncorrected=(f.gpu_value(f.ecc_uncorrectable, i) or 0) if ecc else None,
                ecc_corrected=0 if ecc else None, remapped_rows=rows,
                remap_pending=i in f.remap_pending, remap_failed=i in f.remap_failed,
                xids=tuple(x for g, x in f.xids if g == i),
                temperature_c=f.gpu_value(f.temperature, i) or 40,
                slowdown_c=FAKE_SLOWDOWN_C, shutdown_c=FAKE_SHUTDOWN_C,
                throttle_reasons=f.gpu_value(f.throttle, i) or 0))
        return out

    def telemetry(self) -> list[GpuTelemetry]:
        self.commands.append(("telemetry",))
        self._nvml()
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
        """The `Runner` for MPS: records the command instead of executing it (with the `mps`
        fault, starting the daemon fails as a real one that may not start does)."""
        self.commands.append((*argv, stdin.strip()) if stdin else tuple(argv))
        if self.faults.mps and argv and argv[-1] == "-d":
            raise GpuBackendError(f"{' '.join(argv)} exited 1: cannot create the MPS pipe "
                                  "(fake fault mps)")
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
    adopted: bool = False  # the daemon was running already (a previous agent's, say)

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
        try:
            self.run(argv, "")
        except GpuBackendError as exc:
            # A daemon on these directories already (an agent killed before it could stop
            # its own): use it, as a new one would be used.
            if "already running" not in str(exc):
                raise
            self.adopted = True
        self.started = True

    def stop(self) -> None:
        if self.started:
            self._control("quit")
            self.started = self.adopted = False

    def client_env(self, active_thread_percentage: int) -> dict[str, str]:
        """Environment of a job sharing GPUs through MPS, capped to a share of the SMs."""
        if not 1 <= active_thread_percentage <= 100:
            raise GpuBackendError(
                f"active thread percentage must be 1..100, not {active_thread_percentage}")
        return {**self.env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(active_thread_percentage)}

    def set_default_active_thread_percentage(self, pct: int) -> None:
        self.client_env(pct)  # validates
        self._control(f"set_default_active_thread_percentage {pct}")
