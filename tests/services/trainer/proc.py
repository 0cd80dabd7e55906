"""Launching real trainer processes (`python -m services.trainer`) and reading their records."""

from __future__ import annotations

import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from schemas.trainer import Record, decode

ROOT = Path(__file__).resolve().parents[3]
COMMON = ("--threads", "1", "--log-level", "info")


def rendezvous_port() -> int:
    """A free port for a gang's master, below the kernel's ephemeral range: between picking it
    and rank 0 binding it (seconds of torch imports), no outgoing connection can take it, and
    a rank connecting early cannot connect to itself."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    for _ in range(200):
        port = random.randrange(20000, max(low, 20001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 20000-{low}")


class TrainerProc:
    """One trainer rank; every stdout line is decoded as a protocol record as it arrives."""

    def __init__(self, *args: str, log: Path, via_fd: bool = False) -> None:
        """`via_fd`: records come over an inherited pipe (`--report fd:N`), not stdout."""
        self.log = log
        self._stderr = open(log, "w")  # noqa: SIM115 - closed in wait()
        extra: list[str] = []
        pass_fds: tuple[int, ...] = ()
        if via_fd:
            read_fd, write_fd = os.pipe()
            extra, pass_fds = ["--report", f"fd:{write_fd}"], (write_fd,)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.trainer", *COMMON, *extra, *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, pass_fds=pass_fds,
        )
        self._stream = self.proc.stdout
        if via_fd:
            os.close(write_fd)
            self._stream = os.fdopen(read_fd)
        self.records: list[Record] = []
        self.lines: list[str] = []
        self._queue: queue.Queue[Record | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._stream is not None
        for line in self._stream:
            self.lines.append(line)
            record = decode(line)  # every line must be a valid record
            self.records.append(record)
            self._queue.put(record)
        self._queue.put(None)

    def wait_for(self, pred: Callable[[Record], bool], timeout: float = 120.0) -> Record:
        """The first record after the last one seen that satisfies `pred`. The limit only
        bounds a failure; it is generous because a loaded machine starts torch slowly."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no such record in {timeout:.0f} s; records {[r.event for r in self.records]}"
                    f"; stderr:\n{self.stderr()}") from None
            if record is None:
                raise AssertionError(f"trainer ended first; stderr:\n{self.stderr()}")
            if pred(record):
                return record

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 180.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(timeout)
        self._stderr.close()
        return rc

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.log.read_text()

    def of(self, event: str) -> list[Record]:
        return [r for r in self.records if r.event == event]


def launch(tmp: Path, name: str, *args: str, via_fd: bool = False) -> TrainerProc:
    return TrainerProc(*args, log=tmp / f"{name}.stderr", via_fd=via_fd)
