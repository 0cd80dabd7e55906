"""`detect_backend("auto")` on a node whose DCGM cannot serve: NVML, and nothing left open.

DCGM's Python bindings may be installed where nv-hostengine is not running; they then raise
their own error types, which `auto` must treat like missing bindings (the node agent would
otherwise not start at all on such a GPU node).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from services.nodeagent.gpu import DcgmBackend, GpuBackendError, NvmlBackend, detect_backend
from services.nodeagent.gpu import nvml as gpu_nvml
from tests.services.nodeagent.test_gpu_backends import FakeNvml


class DCGMError_ConnectionNotValid(Exception):  # named as in the bindings
    pass


def no_hostengine() -> Any:
    def handle(ipAddress: str) -> Any:
        raise DCGMError_ConnectionNotValid("Connection not valid")
    return SimpleNamespace(DcgmHandle=handle, DcgmFieldGroup=lambda *a, **k: "fields")


def test_dcgm_without_its_host_engine_is_a_backend_error_and_releases_nvml() -> None:
    nvml = FakeNvml()
    with pytest.raises(GpuBackendError, match="DCGM could not start: "
                                              "DCGMError_ConnectionNotValid"):
        DcgmBackend(nvml, no_hostengine())
    assert nvml.calls == ["init", "shutdown"]


def test_dcgm_bindings_missing_leave_nvml_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(path: str | None = None) -> Any:
        raise GpuBackendError("DCGM bindings not found in /nowhere (pydcgm)")

    monkeypatch.setattr(gpu_nvml, "import_dcgm", missing)
    nvml = FakeNvml()
    with pytest.raises(GpuBackendError, match="bindings not found"):
        DcgmBackend(nvml)
    assert nvml.calls == []


def test_auto_falls_back_to_nvml_when_dcgm_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setattr(gpu_nvml, "import_dcgm", lambda path=None: no_hostengine())
    monkeypatch.setattr(gpu_nvml, "_import_pynvml", lambda: nvml)
    backend = detect_backend("auto")
    assert isinstance(backend, NvmlBackend) and backend.name == "nvml"
    assert len(backend.discover()) == 4
    assert nvml.calls == ["init", "shutdown", "init"]  # DCGM's try released its NVML
