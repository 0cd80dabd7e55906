"""The doctor's probes of the real machine (`RealHost`): the checkpoint directory, torch in a
process of its own, DCGM's absence, and NATS with the clock against a real nats-server."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from services.nodeagent.doctor import Doctor, DoctorConfig
from services.nodeagent.gpu import FakeBackend, FakeFaults
from services.nodeagent.probes import (
    FakeHost,
    RealHost,
    check_storage,
    parse_rfc3339,
    probe_nats,
)
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_live import ensure_stream


def test_storage_is_written_and_measured_or_the_error_named(tmp_path: Path) -> None:
    ok = check_storage(tmp_path / "ckpt", write=True)
    assert ok.error is None and ok.free_bytes and ok.total_bytes
    assert ok.free_bytes <= ok.total_bytes and not list((tmp_path / "ckpt").iterdir())
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = check_storage(blocker / "ckpt", write=False)
    assert bad.error is not None and bad.error.startswith("NotADirectoryError")


def test_rfc3339_times_from_the_server_parse_to_unix_time() -> None:
    assert parse_rfc3339("1970-01-01T00:00:01.5Z") == 1.5
    assert parse_rfc3339("2026-11-26T16:27:37.800343925Z") == pytest.approx(1795710457.800344)
    assert parse_rfc3339("1970-01-01T01:00:00+01:00") == 0.0


def test_the_torch_probe_runs_apart_and_reports_what_torch_can_do() -> None:
    report = RealHost("python-that-does-not-exist").torch()
    assert not report.installed and report.error is not None
    import sys

    report = RealHost(sys.executable).torch()
    assert report.installed and report.version  # torch is in the dev environment
    assert report.gloo is None  # a one-process gloo group works on any machine
    if not report.cuda_available:
        assert report.nccl == "no CUDA" and report.devices == 0


def test_dcgm_absent_is_reported_not_raised() -> None:
    report = RealHost("python3").dcgm(None)
    assert not report.present and "pydcgm" in report.detail


@pytest.mark.nats
async def test_nats_reachable_with_the_clock_against_the_servers(nats_server: Any) -> None:
    host = RealHost("python3", nats_url=nats_server.url, auth=NatsAuth())
    report = await host.nats()
    assert report is not None and report.error is None and report.server
    assert report.skew_s is None and "start the cluster first" in str(report.skew_error)
    nc = await nats.connect(nats_server.url)
    try:
        await ensure_stream(nc.jetstream())
        found = await probe_nats(nc, nats_server.url)
        assert found.skew_s is not None and abs(found.skew_s) < 1.0  # one machine, one clock
        assert found.rtt_s is not None and found.rtt_s < 1.0
        # The node agent's own connection serves as well as a fresh one.
        via_agent = await RealHost("python3", nc=nc).nats()
        assert via_agent is not None and via_agent.skew_s is not None
        # A fake node's skew is added to what was measured: the doctor fails it.
        fake = FakeBackend(1, faults=FakeFaults.parse("skew=12"))
        doctor = Doctor(fake, FakeHost(fake, RealHost("python3", nc=nc)), None, DoctorConfig())
        clock = (await doctor.nats_checks())[1]
        assert clock.status == "fail", clock
        measured = re.match(r"([+-]\d+\.\d+) s against the server", clock.measured)
        assert measured and abs(float(measured.group(1)) - 12.0) < 0.5, clock.measured
    finally:
        await nc.close()


async def test_no_server_is_a_reachability_failure_with_the_cause() -> None:
    started = time.monotonic()
    report = await RealHost("python3", nats_url="nats://127.0.0.1:1", auth=NatsAuth()).nats()
    assert report is not None and report.error is not None and "127.0.0.1:1" in report.error
    assert time.monotonic() - started < 30


async def test_no_nats_configured_is_nothing_to_check() -> None:
    assert await RealHost("python3").nats() is None
    fake = FakeBackend(1, faults=FakeFaults.parse("nats"))
    assert await FakeHost(fake, RealHost("python3")).nats() is None  # `--no-nats`
