"""What the doctor asks of a node beyond its GPUs: DCGM, torch and its collectives, the
checkpoint directory, NATS and the clock.

`RealHost` asks the machine; `FakeHost` answers for a fake node (`FakeBackend`) from its
`FakeFaults`, so each failure the doctor looks for can be injected, and asks the machine only
where the fake has nothing to pretend (the checkpoint directory, a NATS server it was given).
`host_for` picks the one that goes with a backend, as the node agent and `loom doctor` do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from schemas import subjects
from services.nodeagent.gpu import (
    FAKE_DRIVER,
    DcgmBackend,
    FakeBackend,
    FakeFaults,
    GpuBackend,
    GpuBackendError,
    import_dcgm,
)
from services.runtime.nats_auth import NatsAuth

TORCH_PROBE_TIMEOUT_S = 180.0  # importing torch and initialising CUDA on a cold node
NATS_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class DcgmReport:
    present: bool
    detail: str  # its version and host engine, or why it is absent


@dataclass(frozen=True, slots=True)
class TorchReport:
    installed: bool
    version: str | None = None
    cuda: str | None = None  # the CUDA torch was built for (None: a CPU build)
    cuda_available: bool = False
    devices: int = 0
    gloo: str | None = None  # None: usable; else why not
    nccl: str | None = None
    nccl_version: str | None = None
    error: str | None = None  # torch would not import, or the probe failed


@dataclass(frozen=True, slots=True)
class StorageReport:
    path: Path
    error: str | None = None  # why it cannot be written (None: it can)
    free_bytes: int | None = None
    total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class NatsReport:
    url: str
    error: str | None = None  # why it cannot be reached (None: it can)
    server: str | None = None  # its version
    rtt_s: float | None = None
    skew_s: float | None = None  # this clock minus the server's
    skew_error: str | None = None  # why the skew was not measured


class Host(Protocol):
    def dcgm(self, backend: GpuBackend | None) -> DcgmReport: ...

    def torch(self) -> TorchReport: ...

    def storage(self, path: Path, write: bool) -> StorageReport: ...

    async def nats(self) -> NatsReport | None: ...  # None: no NATS to check


class RealHost:
    """The machine itself. NATS is reached through `nc` (a connected client: the node
    agent's own) or by connecting to `nats_url` with `auth` (`loom doctor`); with neither
    there is no NATS to check."""

    def __init__(self, python: str, *, nats_url: str | None = None,
                 auth: NatsAuth | None = None, nc: Any = None) -> None:
        self.python = python
        self.nats_url = nats_url
        self.auth = auth
        self.nc = nc

    def dcgm(self, backend: GpuBackend | None) -> DcgmReport:
        if isinstance(backend, DcgmBackend):
            return DcgmReport(True, "host engine reachable; telemetry from its watched fields")
        try:
            dcgm = import_dcgm()
        except GpuBackendError as exc:
            return DcgmReport(False, str(exc))
        handle = None
        try:
            handle = dcgm.DcgmHandle(ipAddress="127.0.0.1")
            return DcgmReport(True, "bindings and host engine found, but the agent runs the "
                                    f"{backend.name if backend else 'no'} backend")
        except Exception as exc:  # the bindings raise their own error types
            return DcgmReport(False, f"bindings found, host engine not reachable: "
                                     f"{type(exc).__name__}: {exc}")
        finally:
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.Shutdown()

    def torch(self) -> TorchReport:
        argv = [self.python, "-m", "services.nodeagent.torchprobe"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=TORCH_PROBE_TIMEOUT_S, cwd=_source_root())
        except (OSError, subprocess.TimeoutExpired) as exc:
            return TorchReport(installed=False, error=f"{' '.join(argv)}: {exc}")
        lines = done.stdout.strip().splitlines()
        try:
            data = json.loads(lines[-1])
        except (IndexError, ValueError):
            tail = (done.stderr.strip() or done.stdout.strip())[-500:]
            return TorchReport(installed=False, error=f"{' '.join(argv)} exited "
                                                      f"{done.returncode}: {tail}")
        return torch_report(data)

    def storage(self, path: Path, write: bool) -> StorageReport:
        return check_storage(path, write)

    async def nats(self) -> NatsReport | None:
        if self.nc is not None:
            return await probe_nats(self.nc, self.nats_url or _url_of(self.nc))
        if self.nats_url is None:
            return None
        from services.runtime.nats_live import connect_once

        try:
            nc = await connect_once(self.nats_url, self.auth)
        except Exception as exc:  # NatsProblem names the cause and what to do
            return NatsReport(self.nats_url, error=str(exc) or type(exc).__name__)
        try:
            return await probe_nats(nc, self.nats_url)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()


def _source_root() -> str:
    """The directory `services` is imported from: the probe runs as `-m` from there."""
    return str(Path(__file__).resolve().parents[2])


def _url_of(nc: Any) -> str:
    server = getattr(nc, "connected_url", None)
    return server.geturl() if server is not None else "nats"


def torch_report(data: dict[str, Any]) -> TorchReport:
    """The probe's JSON line as a report (unknown keys ignored)."""
    fields = {k: data[k] for k in TorchReport.__dataclass_fields__ if k in data}
    return TorchReport(**fields)


def check_storage(path: Path, write: bool) -> StorageReport:
    """Whether `path` can be written (with `write`, a file is written, synced and removed;
    else the permission bits are asked) and how much room it has."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if write:
            probe = path / f".loom-doctor-{os.getpid()}"
            with open(probe, "wb") as f:
                f.write(b"loom doctor\n")
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
        elif not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"[Errno 13] Permission denied: '{path}'")
        st = os.statvfs(path)
    except OSError as exc:
        return StorageReport(path, error=f"{type(exc).__name__}: {exc}")
    return StorageReport(path, free_bytes=st.f_bavail * st.f_frsize,
                         total_bytes=st.f_blocks * st.f_frsize)


async def probe_nats(nc: Any, url: str, stream: str = subjects.STREAM) -> NatsReport:
    """Round trip to a connected server, and this clock against the server's: the time in
    the event stream's info (`ts`, nats-server 2.10 on) against the middle of the request."""
    try:
        start = time.perf_counter()
        await asyncio.wait_for(nc.flush(), NATS_TIMEOUT_S)
        rtt = time.perf_counter() - start
    except Exception as exc:
        return NatsReport(url, error=f"no answer to a ping: {type(exc).__name__}: {exc}")
    info = getattr(nc, "_server_info", None) or {}
    report = NatsReport(url, server=info.get("version"), rtt_s=rtt)
    try:
        before = time.time()
        reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"",
                                 timeout=NATS_TIMEOUT_S)
        after = time.time()
        data = json.loads(reply.data)
    except Exception as exc:
        return replace(report, skew_error=f"JetStream did not answer: {type(exc).__name__}: "
                                          f"{exc}")
    if "error" in data:
        why = data["error"].get("description", data["error"])
        return replace(report, skew_error=f"no {stream} stream to read the server's time "
                                          f"from ({why}): start the cluster first")
    stamp = data.get("ts")
    if not isinstance(stamp, str):
        return replace(report, skew_error="the server does not report its time (nats-server "
                                          "older than 2.10)")
    try:
        server_time = parse_rfc3339(stamp)
    except ValueError as exc:
        return replace(report, skew_error=str(exc))
    return replace(report, skew_s=(before + after) / 2 - server_time)


def parse_rfc3339(text: str) -> float:
    """`2026-11-26T16:27:37.800343925Z` as a Unix time (nanoseconds cut to microseconds);
    ValueError for anything else."""
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    head, fraction, zone = m.groups()
    digits = (fraction or "")[:6].ljust(6, "0")
    zone = "+00:00" if zone in ("Z", "z") else zone
    return datetime.fromisoformat(f"{head}.{digits}{zone}").timestamp()


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|z|[+-]\d\d:\d\d)$")


class FakeHost:
    """A fake node's answers, from its faults; `real` answers where the fake does not
    pretend (the checkpoint directory's writability and room, and NATS when it has one)."""

    def __init__(self, backend: FakeBackend, real: RealHost | None = None) -> None:
        self.backend = backend
        self.real = real

    @property
    def faults(self) -> FakeFaults:
        return self.backend.faults

    def dcgm(self, backend: GpuBackend | None) -> DcgmReport:
        if self.faults.no_dcgm:
            return DcgmReport(False, "DCGM bindings not found (fake fault no_dcgm)")
        return DcgmReport(True, "fake host engine")

    def torch(self) -> TorchReport:
        f = self.faults
        if f.no_torch:
            return TorchReport(installed=False,
                               error="ModuleNotFoundError: No module named 'torch' (fake fault)")
        cuda = not f.no_cuda
        return TorchReport(
            installed=True, version="2.13.0+fake", cuda=(f.torch_cuda or FAKE_DRIVER.cuda_version)
            if cuda else None, cuda_available=cuda,
            devices=max(0, self.backend.count - f.missing) if cuda else 0,
            gloo="RuntimeError: gloo cannot bind (fake fault no_gloo)" if f.no_gloo else None,
            nccl=("no CUDA" if not cuda else
                  "RuntimeError: NCCL error: unhandled system error (fake fault no_nccl)"
                  if f.no_nccl else None),
            nccl_version="2.21.5" if cuda else None)

    def storage(self, path: Path, write: bool) -> StorageReport:
        if self.faults.checkpoint_readonly:
            return StorageReport(path, error=f"PermissionError: [Errno 13] Permission denied: "
                                             f"'{path}' (fake fault checkpoint_readonly)")
        found = (self.real.storage(path, write) if self.real is not None
                 else check_storage(path, write))
        if self.faults.checkpoint_free is not None and found.error is None:
            total = max(found.total_bytes or 0, self.faults.checkpoint_free)
            return replace(found, free_bytes=self.faults.checkpoint_free, total_bytes=total)
        return found

    async def nats(self) -> NatsReport | None:
        """Without `real` (tests) a server is pretended; with one that has no NATS to check
        there is none."""
        real = self.real
        if real is not None and real.nats_url is None and real.nc is None:
            return None
        url = (real.nats_url if real is not None else None) or "nats://fake"
        if self.faults.nats:
            return NatsReport(url, error=f"no server at {url}: connection refused "
                                         "(fake fault nats)")
        found = await self.real.nats() if self.real is not None else None
        if found is None:
            return NatsReport(url, server="fake", rtt_s=0.0, skew_s=self.faults.skew_s)
        if found.skew_s is not None:
            return replace(found, skew_s=found.skew_s + self.faults.skew_s)
        if self.faults.skew_s and found.error is None:
            return replace(found, skew_s=self.faults.skew_s, skew_error=None)
        return found


def host_for(backend: GpuBackend | None, real: RealHost) -> Host:
    """The host that goes with a backend: a fake node's answers come from its faults."""
    return FakeHost(backend, real) if isinstance(backend, FakeBackend) else real
