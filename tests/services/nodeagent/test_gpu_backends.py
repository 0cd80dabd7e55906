"""GPU backends: the NVML code path against a stand-in pynvml module, the fake, MPS commands.

No GPU here, so NVML itself cannot run; `FakeNvml` mimics the few pynvml calls the backend
makes (same names and return shapes as nvidia-ml-py 13), which checks that the backend reads
them correctly. The fake backend and MPS control are checked by the commands they record.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.nodeagent.gpu import (
    DcgmBackend,
    FakeBackend,
    GpuBackendError,
    GpuLink,
    MpsControl,
    NvmlBackend,
    detect_backend,
    import_dcgm,
)


class FakeNvml:
    """Four GPUs; 0-1 and 2-3 joined by NVLink, 0-2 under one PCIe switch, others via host."""

    NVML_NVLINK_MAX_LINKS = 4

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h:04d}".encode()  # older bindings return bytes

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=40 << 30, used=(h + 1) << 30)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{h:02X}:00.0")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=25 * h)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=1000 + h)] if h < 2 else []

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 1:
            raise self.NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{h ^ 1:02X}:00.0")

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 20 if {a, b} == {0, 2} else 30


def test_nvml_discovery_reads_every_gpu() -> None:
    gpus = NvmlBackend(FakeNvml()).discover()
    assert [g.uuid for g in gpus] == ["GPU-0000", "GPU-0001", "GPU-0002", "GPU-0003"]
    assert gpus[3].memory_bytes == 40 << 30 and gpus[3].pci_bus_id == "00000000:03:00.0"


def test_nvml_telemetry_reports_utilisation_memory_and_processes() -> None:
    t = NvmlBackend(FakeNvml()).telemetry()
    assert [x.utilization_ratio for x in t] == [0.0, 0.25, 0.5, 0.75]
    assert t[1].memory_used_bytes == 2 << 30
    assert [x.processes for x in t] == [(1000,), (1001,), (), ()]


def test_nvml_topology_tells_nvlink_from_pcie() -> None:
    links = {(x.a, x.b): x.kind for x in NvmlBackend(FakeNvml()).topology()}
    assert links[("GPU-0000", "GPU-0001")] == "nvlink"
    assert links[("GPU-0002", "GPU-0003")] == "nvlink"
    assert links[("GPU-0000", "GPU-0002")] == "pcie-switch"
    assert links[("GPU-0001", "GPU-0003")] == "pcie-host"
    assert len(links) == 6


def test_nvml_that_cannot_start_is_a_clear_error() -> None:
    with pytest.raises(GpuBackendError, match="NVML could not start: NVML Shared Library"):
        NvmlBackend(FakeNvml(fail_init=True))


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None,
                    reason="nvidia-ml-py is installed; this checks the message without it")
def test_missing_nvml_package_names_the_extra_to_install() -> None:
    with pytest.raises(GpuBackendError, match=r"loom-scheduler\[gpu\]"):
        detect_backend("nvml")


def test_dcgm_bindings_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GpuBackendError, match=f"DCGM bindings not found in {tmp_path}"):
        import_dcgm(str(tmp_path))


def test_dcgm_telemetry_comes_from_its_fields() -> None:
    sample = SimpleNamespace
    values = {i: {203: [sample(value=10 * i)], 252: [sample(value=1024)]} for i in range(4)}

    class Group:
        samples = SimpleNamespace(WatchFields=lambda *a: None,
                                  GetLatest_v2=lambda fields: SimpleNamespace(values=values))

    class Handle:
        def __init__(self, ipAddress: str) -> None:
            self.closed = False

        def GetSystem(self) -> Any:
            return SimpleNamespace(GetDefaultGroup=lambda: Group())

        def Shutdown(self) -> None:
            self.closed = True

    dcgm = SimpleNamespace(DcgmHandle=Handle, DcgmFieldGroup=lambda *a, **k: "fields")
    backend = DcgmBackend(FakeNvml(), dcgm)
    t = backend.telemetry()
    assert [x.utilization_ratio for x in t] == [0.0, 0.1, 0.2, 0.3]
    assert t[0].memory_used_bytes == 1 << 30 and t[0].processes == (1000,)


def test_unknown_backend_name() -> None:
    with pytest.raises(GpuBackendError, match="unknown GPU backend 'cuda'"):
        detect_backend("cuda")


def test_fake_backend_has_the_gpus_asked_for_and_records_calls() -> None:
    fake = FakeBackend(4, "v100", node="n1")
    assert [g.uuid for g in fake.discover()] == [f"GPU-fake-n1-{i}" for i in range(4)]
    fake.busy[fake.uuid(2)] = (42,)
    t = fake.telemetry()
    assert [x.processes for x in t] == [(), (), (42,), ()]
    assert GpuLink(fake.uuid(0), fake.uuid(1), "nvlink") in fake.topology()
    assert fake.commands == [("discover",), ("telemetry",), ("topology",)]
    with pytest.raises(GpuBackendError):
        FakeBackend(-1)


def test_mps_start_set_share_and_stop_send_the_documented_commands(tmp_path: Path) -> None:
    fake = FakeBackend(2)
    mps = MpsControl(tmp_path / "pipe", tmp_path / "log", run=fake.run)
    mps.start()
    mps.start()  # idempotent: one daemon
    mps.set_default_active_thread_percentage(50)
    env = mps.client_env(50)
    mps.stop()
    prefix = ("env", f"CUDA_MPS_PIPE_DIRECTORY={tmp_path / 'pipe'}",
              f"CUDA_MPS_LOG_DIRECTORY={tmp_path / 'log'}", "nvidia-cuda-mps-control")
    assert fake.commands == [
        (*prefix, "-d"),
        (*prefix, "set_default_active_thread_percentage 50"),
        (*prefix, "quit"),
    ]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert (tmp_path / "pipe").is_dir()
    with pytest.raises(GpuBackendError, match=r"1\.\.100"):
        mps.client_env(0)


def test_mps_command_failure_is_reported_with_its_output(tmp_path: Path) -> None:
    mps = MpsControl(tmp_path / "p", tmp_path / "l", binary="false")
    with pytest.raises(GpuBackendError, match="exited 1"):
        mps.start()


def test_mps_adopts_a_daemon_already_running_on_its_directories(tmp_path: Path) -> None:
    """An agent killed before it could stop its daemon leaves it running: the next agent
    uses it instead of failing every co-located job's start."""
    def busy(argv: Any, stdin: str = "") -> str:
        if argv[-1] == "-d":
            raise GpuBackendError("nvidia-cuda-mps-control -d exited 1: An instance of this "
                                  "daemon is already running")
        return ""

    mps = MpsControl(tmp_path / "p", tmp_path / "l", run=busy)
    mps.start()
    assert mps.started and mps.adopted
    mps.stop()
    assert not mps.started and not mps.adopted
    with pytest.raises(GpuBackendError, match="exited 1"):
        MpsControl(tmp_path / "p", tmp_path / "l", binary="false").start()
