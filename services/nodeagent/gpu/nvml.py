"""The real backends: NVML through nvidia-ml-py, and DCGM's field API for telemetry."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from services.nodeagent.gpu.interface import (
    DriverInfo,
    GpuBackend,
    GpuBackendError,
    GpuHealth,
    GpuInfo,
    GpuLink,
    GpuTelemetry,
    LinkKind,
)

# NVML's nvmlGpuTopologyLevel_t → how two GPUs talk (nearest first); NVLink is checked apart.
_NVML_LEVEL: dict[int, LinkKind] = {0: "pcie-switch", 10: "pcie-switch", 20: "pcie-switch",
                                    30: "pcie-host", 40: "system", 50: "system"}
DCGM_DEFAULT_PATH = "/usr/local/dcgm/bindings/python3"


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
        self._closed = False

    def _open(self) -> Any:
        """The bindings, unless closed: NVML called after nvmlShutdown (a freed event set
        above all) crashes the process instead of raising."""
        if self._closed:
            raise GpuBackendError(f"the {self.name} backend is closed")
        return self._nvml

    def driver(self) -> DriverInfo:
        n = self._open()
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
        self._open()
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
        n = self._open()
        return [GpuInfo(index=i, uuid=_text(n.nvmlDeviceGetUUID(h)),
                        name=_text(n.nvmlDeviceGetName(h)),
                        memory_bytes=int(n.nvmlDeviceGetMemoryInfo(h).total),
                        pci_bus_id=_text(n.nvmlDeviceGetPciInfo(h).busId))
                for i, h in enumerate(self._handles)]

    def telemetry(self) -> list[GpuTelemetry]:
        n = self._open()
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
        n = self._open()
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
        """Free the event set and shut NVML down, once; every later call raises."""
        if self._closed:
            return
        self._closed = True
        if self._events:
            with contextlib.suppress(Exception):
                self._nvml.nvmlEventSetFree(self._events)
        self._events = None
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
        self._open()
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
        if not self._closed:
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

