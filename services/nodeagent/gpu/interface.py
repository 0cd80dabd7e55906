"""What every GPU backend reports: devices, telemetry, links, the driver and health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

LinkKind = Literal["nvlink", "pcie-switch", "pcie-host", "system"]


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

