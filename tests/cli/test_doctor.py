"""`loom doctor`: a table for people, `--json` for tools, exit status by the worst result
(0 pass, 1 warn, 2 fail), on fake GPUs with injected faults; and `loom status` showing why
nodes and GPUs take no new work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loom import live_cli
from loom.cli import main
from loom.status_view import node_lines
from services.nodeagent.doctor import CHECKS


def doctor(tmp_path: Path, *flags: str) -> list[str]:
    return ["doctor", "--fake-gpus", "2", "--node", "n0", "--no-nats",
            "--checkpoint-root", str(tmp_path / "ckpt"), *flags]


def test_a_healthy_fake_node_prints_every_check_and_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(doctor(tmp_path)) == 0
    printed = capsys.readouterr().out
    names = [line.split("│")[1].strip() for line in printed.splitlines()
             if line.startswith("│") and line.split("│")[1].strip()]
    assert set(names) == set(CHECKS)
    assert "loom doctor: n0" in printed and "(exit status 0)" in printed


@pytest.mark.parametrize(("faults", "code", "worst"), [
    ("", 0, "pass"),
    ("no_dcgm", 1, "warn"),
    ("throttle=0", 1, "warn"),
    ("no_dcgm,xid=1:79", 2, "fail"),
    ("checkpoint_readonly", 2, "fail"),
])
def test_json_for_tools_and_the_exit_status_of_the_worst_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], faults: str, code: int,
        worst: str) -> None:
    assert main(doctor(tmp_path, "--json", "--fake-faults", faults)) == code
    report = json.loads(capsys.readouterr().out)
    assert report["worst"] == worst and report["exit_status"] == code
    assert report["node"] == "n0"
    assert {c["check"] for c in report["checks"]} == set(CHECKS)
    for c in report["checks"]:
        assert set(c) == {"check", "title", "gpu", "status", "measured", "fix"}
        assert c["status"] in ("pass", "warn", "fail", "skip")
        assert bool(c["fix"]) == (c["status"] in ("warn", "fail"))


def test_faults_also_come_from_the_environment(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_FAKE_FAULTS", "ecc_uncorrectable=0")
    assert main(doctor(tmp_path, "--json")) == 2
    failed = [(c["check"], c["gpu"]) for c in json.loads(capsys.readouterr().out)["checks"]
              if c["status"] == "fail"]
    assert failed == [("ecc", 0)]


@pytest.mark.parametrize(("flags", "message"), [
    (["--fake-faults", "bogus"], "unknown fake fault 'bogus'"),
    (["--fake-faults", "xid=x:79"], "fake fault 'xid=x:79'"),
])
def test_bad_faults_are_named_on_stderr_with_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
        message: str) -> None:
    assert main(doctor(tmp_path, *flags)) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_faults_need_fake_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--no-nats", "--fake-faults", "nats"]) == 2
    assert "--fake-faults needs --fake-gpus" in capsys.readouterr().err


def test_without_nvml_the_driver_fails_and_the_gpu_checks_are_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """This machine has no GPU (nor nvidia-ml-py): the real backend cannot start."""
    code = main(["doctor", "--no-nats", "--json", "--trainers", "simulated",
                 "--checkpoint-root", str(tmp_path / "ckpt"), "--gpu-backend", "nvml"])
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    if checks["driver"]["status"] == "pass":  # pragma: no cover - a GPU machine
        pytest.skip("this machine has a working NVIDIA driver")
    assert code == 2 and checks["driver"]["status"] == "fail"
    assert checks["gpus"]["status"] == "skip" and checks["ecc"]["status"] == "skip"


STATE: dict[str, Any] = {
    "now": 10.0, "policy": "fifo", "cycle": 3, "nodes": ["n0", "n1", "n2"], "jobs": [],
    "drained": ["n2"], "lost": ["n1"], "suspended": [],
    "cordoned": {"n0": {"health": "checkpoint: /ckpt not writable"},
                 "n2": {"operator": "drained by ann"}},
    "gpus_out": {"n1": {"3": "xid: GPU 3: XID 79 (GPU has fallen off the bus)"}},
    "health_warnings": {"n0": "dcgm: absent"},
}


def test_status_says_which_nodes_and_gpus_take_no_work_and_why(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert node_lines(STATE) == [
        "n0 cordoned (health: checkpoint: /ckpt not writable)",
        "n2 cordoned (operator: drained by ann)",
        "n1 GPU 3 out of service (xid: GPU 3: XID 79 (GPU has fallen off the bus))",
        "n1 lost (no heartbeat)",
        "n0 health warnings: dcgm: absent"]
    # A scheduler from before health reports only its operator's drains.
    assert node_lines({"drained": ["n2"], "lost": []}) == [
        "n2 cordoned (operator: drained)"]

    async def fake_status(url: str, auth: Any = None) -> dict[str, Any]:
        return STATE

    monkeypatch.setattr(live_cli, "_status", fake_status)
    assert main(["status"]) == 0
    printed = capsys.readouterr().out
    assert "n0 cordoned (health: checkpoint: /ckpt not writable)" in printed
    assert "n1 GPU 3 out of service" in printed
