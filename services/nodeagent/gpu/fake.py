"""GPUs that exist only in memory, and the faults they can be told to show."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.nodeagent.gpu.interface import (
    DriverInfo,
    GpuBackendError,
    GpuHealth,
    GpuInfo,
    GpuLink,
    GpuTelemetry,
)

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
    closed: bool = False

    def __post_init__(self) -> None:
        if self.count < 0:
            raise GpuBackendError(f"fake GPU count must be ≥ 0, not {self.count}")

    def uuid(self, index: int) -> str:
        return f"GPU-fake-{self.node}-{index}"

    def _nvml(self) -> None:
        if self.closed:  # as the real backends: no calls after close
            raise GpuBackendError(f"the {self.name} backend is closed")
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
        self._nvml()
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
        self.closed = True

