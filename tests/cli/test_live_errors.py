"""What a live command says when it cannot start: nothing listening at the NATS URL, or a port
it would bind already taken. One line on stderr that names the cause (and the flag that
changes it), no traceback, promptly.

Each runs `loom` as a process with a deadline: before, `loom serve` retried a missing server
for ever, and a second `loom up` blamed NATS for the Prometheus port ("Address already in
use"), printed tracebacks and waited a minute for a metrics service that had died.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.natsserver import free_port

pytestmark = pytest.mark.nats


def loom(argv: list[str], tmp_path: Path, timeout: float = 30.0,
         env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    """`loom ARGV` in `tmp_path` (its own XDG_RUNTIME_DIR): the result and its duration."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_NATS")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "loom.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path,
                          env={**clean, "XDG_RUNTIME_DIR": str(tmp_path),
                               "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                               **(env or {})})
    return done, time.monotonic() - start


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A free port that another process (here: this one) is listening on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield int(other.getsockname()[1])


def closed_url() -> str:
    return f"nats://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("argv", [
    ["up", "--local-nodes", "1", "--trainers", "simulated"],
    ["serve", "metrics", "--cluster", "n1g4", "--nats-url", closed_url()],
], ids=["up", "serve-metrics"])
def test_a_taken_prometheus_port_is_named_before_anything_starts(
        argv: list[str], taken_port: int, tmp_path: Path) -> None:
    done, took = loom([*argv, "--prometheus-port", str(taken_port)], tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"error: port {taken_port} is in use: choose another with "
                           "--prometheus-port\n")
    assert done.stdout == ""  # `loom up: N services on ...` never printed: nothing started
    assert not list(tmp_path.rglob("nats-url"))  # no cluster recorded for `loom status`
    assert took < 10, took


@pytest.mark.parametrize("argv", [
    ["status"],
    ["submit", "--model", "cnn", "--gpus", "1", "--iterations", "5"],
    ["cancel", "job-1"],
    ["log", "export", "--out", "run.eventlog.gz"],
    ["serve", "scheduler", "--cluster", "n1g4"],
    ["up", "--local-nodes", "1", "--prometheus-port", "0"],
], ids=lambda a: a[0] if a[0] != "log" else "log-export")
def test_no_server_at_the_url_is_named(argv: list[str], tmp_path: Path) -> None:
    url = closed_url()
    done, took = loom([*argv, "--nats-url", url], tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith(f"error: no server at {url}: connection refused"), \
        done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert took < 15, took  # a service tries for about 5 s; a command, one retry


def test_a_taken_port_is_refused_by_the_check_itself() -> None:
    """The check binds as the HTTP server does: a listener's port is taken, a free one is
    not, a port out of range is named."""
    from loom.live_cli import PortInUse, check_port

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} is in use: choose another with --x"):
            check_port(port, "--x")
    check_port(free_port(), "--x")
    with pytest.raises(ValueError, match="--x 70000: not a port"):
        check_port(70000, "--x")
