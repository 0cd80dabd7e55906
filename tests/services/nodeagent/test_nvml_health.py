"""The NVML health reads (`NvmlBackend.driver`, `.health`) against a stand-in pynvml module.

No GPU here, so NVML itself cannot run; `HealthNvml` mimics the calls the health checks
make, with nvidia-ml-py's names, return shapes and error codes (NVMLError.value), over four
GPUs: a healthy one, one with every fault, a consumer-style one that supports few reads
(older page retirement instead of row remapping, the pre-12.535 throttle call), and one that
has fallen off the bus. The doctor then turns what was read into verdicts per GPU.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.nodeagent.doctor import Doctor, DoctorConfig
from services.nodeagent.gpu import DriverInfo, GpuBackendError, NvmlBackend
from services.nodeagent.probes import FakeHost
from tests.services.nodeagent.test_gpu_backends import FakeNvml

NOT_SUPPORTED, NO_PERMISSION, TIMEOUT, GPU_IS_LOST = 3, 4, 10, 15
NAMES = {NOT_SUPPORTED: "Not Supported", NO_PERMISSION: "Insufficient Permissions",
         TIMEOUT: "Timeout", GPU_IS_LOST: "GPU is lost"}


class HealthNvml(FakeNvml):
    NVML_FEATURE_ENABLED = 1
    nvmlEventTypeXidCriticalError = 0x8

    class NVMLError(Exception):
        def __init__(self, value: int | str) -> None:
            self.value = value if isinstance(value, int) else None
            super().__init__(NAMES.get(value, value) if isinstance(value, int) else value)

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Any] = []
        self.freed = False
        self.driver_fails = False

    def _unsupported(self, h: int, *on: int) -> None:
        if h in on:
            raise self.NVMLError(NOT_SUPPORTED)

    def nvmlSystemGetDriverVersion(self) -> bytes:
        if self.driver_fails:
            raise self.NVMLError("Driver Not Loaded")
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        if h == 3:
            raise self.NVMLError(GPU_IS_LOST)
        return super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        self._unsupported(h, 2)
        return [1, 1]

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        assert counter == 0  # volatile
        return {(0, 0): 2, (0, 1): 0, (1, 0): 2, (1, 1): 5}[(h, kind)] if h < 2 else 0

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        self._unsupported(h, 0, 1)
        return [0x1000, 0x2000] if cause == 0 else [0x3000]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return 1

    def nvmlDeviceGetRemappedRows(self, h: int) -> list[int]:
        self._unsupported(h, 2)
        return [0, 0, 0, 0] if h == 0 else [3, 1, 0, 1]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 93 if h == 1 else 45

    def nvmlDeviceGetTemperatureThreshold(self, h: int, which: int) -> int:
        self._unsupported(h, 2)
        return 92 if which == 0 else 87  # 0: shutdown, 1: slowdown

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        if h == 2:
            raise self.NVMLError(NO_PERMISSION)
        return 0x40 if h == 1 else 0x1

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, events: str) -> None:
        assert types == 0x8 and events == "event-set"
        self._unsupported(h, 2)

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never blocks the heartbeat
        if not self.events:
            raise self.NVMLError(TIMEOUT)
        return self.events.pop(0)

    def nvmlDeviceGetIndex(self, device: int) -> int:
        return device

    def nvmlEventSetFree(self, events: str) -> None:
        self.freed = True


def xid(gpu: int, code: int) -> Any:
    return SimpleNamespace(device=gpu, eventType=0x8, eventData=code)


def test_driver_versions_are_read_and_a_silent_driver_is_an_error() -> None:
    nvml = HealthNvml()
    backend = NvmlBackend(nvml)
    assert backend.driver() == DriverInfo("550.54.15", "12.4", "12.550.54.15")
    nvml.driver_fails = True
    with pytest.raises(GpuBackendError, match="NVML does not answer: Driver Not Loaded"):
        backend.driver()


def test_every_health_field_is_read_with_unsupported_reads_as_none() -> None:
    nvml = HealthNvml()
    backend = NvmlBackend(nvml)
    healthy, faulty, consumer, lost = backend.health()
    assert (healthy.ecc_enabled, healthy.ecc_uncorrected, healthy.ecc_corrected) == (True, 0, 2)
    assert healthy.remapped_rows == (0, 0) and not healthy.remap_failed
    assert healthy.retired_pages is None  # row remapping instead (Ampere on)
    assert (healthy.temperature_c, healthy.slowdown_c, healthy.shutdown_c) == (45, 87, 92)
    assert healthy.throttle_reasons == 0x1 and healthy.errors == () and healthy.xids == ()
    assert (faulty.ecc_uncorrected, faulty.remapped_rows, faulty.remap_failed) == (5, (3, 1),
                                                                                   True)
    assert faulty.temperature_c == 93 and faulty.throttle_reasons == 0x40
    assert consumer.ecc_enabled is None and consumer.ecc_uncorrected is None
    assert (consumer.retired_pages, consumer.retired_pending) == (3, True)
    assert consumer.remapped_rows is None and consumer.shutdown_c is None
    assert consumer.throttle_reasons is None
    assert consumer.errors == ("throttling: Insufficient Permissions",)
    assert consumer.xid_watch is not None and "not available" in consumer.xid_watch
    assert lost.lost == "GPU is lost" and lost.uuid == "GPU #3"


def test_xids_are_collected_from_nvml_events_since_the_first_read() -> None:
    nvml = HealthNvml()
    backend = NvmlBackend(nvml)
    assert [h.xids for h in backend.health()[:2]] == [(), ()]
    nvml.events += [xid(1, 79), xid(0, 13)]
    assert [h.xids for h in backend.health()[:2]] == [(13,), (79,)]
    nvml.events.append(xid(1, 48))
    assert backend.health()[1].xids == (79, 48)  # kept: a fatal XID needs a reset
    backend.close()
    assert nvml.freed and nvml.calls[-1] == "shutdown"


def test_a_closed_backend_refuses_every_call_instead_of_touching_nvml() -> None:
    # Found on an H200: a heartbeat after the agent closed its backend waited on the freed
    # XID event set and the process died of a segmentation fault.
    nvml = HealthNvml()
    backend = NvmlBackend(nvml)
    backend.health()  # the event set exists from here on
    backend.close()
    backend.close()
    assert nvml.freed and nvml.calls.count("shutdown") == 1

    def no_more_waits(events: str, timeout_ms: int) -> Any:
        raise AssertionError("NVML's event set was used after close")

    nvml.nvmlEventSetWait_v2 = no_more_waits  # type: ignore[method-assign]
    for call in (backend.health, backend.telemetry, backend.discover, backend.driver,
                 backend.topology):
        with pytest.raises(GpuBackendError, match="the nvml backend is closed"):
            call()


def test_the_throttle_reasons_of_older_bindings_are_read_too() -> None:
    class Older(HealthNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
            return 0x8

    assert NvmlBackend(Older()).health()[0].throttle_reasons == 0x8


def test_the_doctor_reads_nvml_into_verdicts_per_gpu(tmp_path: Path) -> None:
    from services.nodeagent.gpu import FakeBackend

    nvml = HealthNvml()
    backend = NvmlBackend(nvml)
    backend.health()  # starts watching XIDs, as the agent's start-up checks do
    nvml.events.append(xid(1, 79))
    host = FakeHost(FakeBackend(0))  # the rest of the node: nothing wrong
    doctor = Doctor(backend, host, None, DoctorConfig(checkpoint_root=tmp_path, expect_gpus=4))
    checks = asyncio.run(doctor.run())
    status = {(c.name, c.gpu): c.status for c in checks}
    assert status[("driver", None)] == "pass" and status[("gpus", None)] == "pass"
    assert status[("gpus", 3)] == "fail"  # lost: out of service
    assert {name for (name, gpu), s in status.items() if gpu == 1 and s == "fail"} == {
        "ecc", "memory", "xid", "temperature"}
    assert status[("throttle", 1)] == "warn"
    assert all(s == "pass" for (name, gpu), s in status.items() if gpu == 0)
    assert status[("memory", 2)] == "warn"  # a retirement waits for a reboot
    assert status[("xid", 2)] == "skip" and status[("ecc", 2)] == "pass"
    unread = next(c for c in checks if c.name == "throttle" and c.gpu == 2)
    assert unread.status == "warn"  # NVML refused the read: said, not taken for a pass
    assert "could not read throttling: Insufficient Permissions" in unread.measured
    assert not [k for k in status if k[1] == 3 and k[0] != "gpus"]
