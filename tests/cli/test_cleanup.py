"""`loom demo` and `loom up` stopped by SIGINT or SIGTERM leave none of their temporary
folders (`loom-demo-*`, `loom-nats-*`, `loom-up-*`): a real process, a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

LEFTOVERS = ("loom-demo-", "loom-nats-", "loom-up-")


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def _ours(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(LEFTOVERS))


def _start(args: list[str], tmp: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TMPDIR": str(tmp), "XDG_RUNTIME_DIR": str(tmp)}
    return subprocess.Popen([sys.executable, "-m", "loom.cli", *args], cwd=tmp, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


COMMANDS = {
    "demo": (["demo", "--timeout", "120"], ("loom-demo-", "loom-nats-")),
    "up": (["up", "--local-nodes", "1", "--gpus-per-node", "1", "--trainers", "simulated",
            "--prometheus-port", "0"], ("loom-up-", "loom-nats-")),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_signal_removes_the_temporary_folders(command: str, sig: signal.Signals,
                                                tmp_path: Path) -> None:
    if command == "demo":
        pytest.importorskip("torch")
    args, expected = COMMANDS[command]
    proc = _start(args, tmp_path)
    try:
        made = _wait_for(lambda: all(any(n.startswith(p) for n in _ours(tmp_path))
                                    for p in expected), timeout=60)
        assert made, (_ours(tmp_path), proc.poll())
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in err, err
    # The demo reports the signal (128 + n); `loom up` drains its services and exits 0 once
    # they were up, 130 when the signal cut their start short.
    assert rc in ((128 + int(sig),) if command == "demo" else (0, 130)), (rc, err)
    assert _ours(tmp_path) == []


def test_demo_timeout_bounds_the_whole_run(tmp_path: Path) -> None:
    """--timeout covers the start of the cluster and the waits between the waves too: a
    timeout too short for anything ends the demo at once (exit 1), leaving nothing behind."""
    pytest.importorskip("torch")
    t0 = time.monotonic()
    proc = _start(["demo", "--timeout", "1"], tmp_path)
    rc = proc.wait(timeout=120)
    took = time.monotonic() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert rc == 1, err
    assert took < 1 + 6  # the timeout, and the teardown of what had started
    assert _ours(tmp_path) == []
