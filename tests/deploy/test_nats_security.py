"""deploy/nats/auth.conf and tls.conf on a real nats-server (tests/deploy/secure_cluster.py):
they parse (and a broken copy does not), a node agent cannot publish another node's subjects,
a submitter can only submit, and services logged in as themselves, over TLS, run a job end to
end without one permission violation."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.serve import control_subject, ping, serve
from schemas import subjects
from schemas.tenants import parse_tenants
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_live import ensure_stream
from services.runtime.natsserver import free_port
from tests.deploy.secure_cluster import (
    LEGACY_SHARED,
    NATS_DIR,
    PASSWORD_ENV,
    REPO,
    USERS,
    Server,
    Services,
    Tls,
    as_user,
    binary,
    check,
    cluster_opts,
    connect,
    flags,
    password,
    publish_denied,
    stored,
)

pytestmark = pytest.mark.nats


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


async def test_node_agents_and_submitters_publish_only_their_own_subjects(
        server: Server, tls: Tls) -> None:
    admin = await connect("admin", server, tls)
    js = admin.jetstream()
    await ensure_stream(js)
    errors: list[str] = []
    node = await connect("node-n0", server, tls, errors)
    submitter = await connect("submitter", server, tls, errors)
    try:
        # A node speaks only on its own subjects, and never gives itself commands.
        node_denied = (subjects.node_command("n1"), subjects.node_command("n0"),
                       subjects.node_subject("n1", subjects.STATUS),
                       subjects.node_subject("n1", subjects.FINISHED), *LEGACY_SHARED,
                       subjects.OPERATOR, subjects.PLAN_DECIDED, subjects.JOB_SUBMIT)
        for subject in node_denied:
            await publish_denied(node, errors, subject)
        for kind in (subjects.STATUS, subjects.FINISHED, subjects.HEARTBEAT):
            ack = await node.jetstream().publish(subjects.node_subject("n0", kind), b"ok")
            assert ack.seq >= 1

        submitter_denied = (subjects.OPERATOR, subjects.node_subject("n0", subjects.FINISHED),
                            subjects.node_command("n0"), subjects.JOB_TRANSITION,
                            "$JS.API.STREAM.DELETE.LOOM", "$JS.API.STREAM.INFO.LOOM")
        for subject in submitter_denied:
            await publish_denied(submitter, errors, subject)
        # Across accounts: PEOPLE's submission lands in LOOM's stream, acknowledged.
        ack = await submitter.jetstream().publish(subjects.JOB_SUBMIT, b"{}")
        assert ack.stream == subjects.STREAM

        assert await stored(js, "loom.>") == 4  # n0's three reports, the submission
        assert await stored(js, subjects.JOB_SUBMIT) == 1
        assert len(server.violations()) == len(node_denied) + len(submitter_denied)
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


@pytest.mark.parametrize("server", ["tls.conf"], indirect=True)  # auth.conf: same accounts
async def test_services_logged_in_as_themselves_run_a_job_end_to_end(
        server: Server, tls: Tls, tmp_path: Path) -> None:
    admin = await connect("admin", server, tls)
    await ensure_stream(admin.jetstream())
    stop = asyncio.Event()
    names = ("scheduler", "placer", "metrics", "nodeagent")
    # A queue, so the scheduler publishes its queues' status and answers `loom queues`.
    queues = parse_tenants({"queues": {"lab": {"tenants": ["default"], "nominal": 2}}}, "t")
    opts = {s: cluster_opts(s, server, tls) for s in names}
    opts["scheduler"] = dataclasses.replace(opts["scheduler"], tenants=queues)
    runs = [asyncio.create_task(serve(opts[s], stop)) for s in names]
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
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "loom.cli", "queues", "--json",
                             "--nats-url", server.url],
            capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert [q["name"] for q in json.loads(done.stdout)["queues"]] == ["lab"]
        assert server.violations() == []  # every service had all the rights it needed
    finally:
        stop.set()
        codes = await asyncio.gather(*runs, return_exceptions=True)
        await admin.close()
    assert codes == [0] * len(names)


# Every order in which the four can start (and then restart).
ORDERS = list(itertools.permutations(("scheduler", "placer", "metrics", "nodeagent-n0")))


@pytest.mark.parametrize("server", ["auth.conf"], indirect=True)  # tls.conf: same accounts
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "-".join(s[0] for s in o))
async def test_each_role_restarts_on_a_stream_with_history(
        server: Server, tls: Tls, order: tuple[str, ...], tmp_path: Path) -> None:
    """The shipped roles, every service restarted once on a stream that holds a run: a
    restarted scheduler or node agent rebuilds from the stream (a pull consumer), which its
    role must allow. Before, the scheduler gave up after 25 s ("did not arrive")."""
    admin = await connect("admin", server, tls)
    await ensure_stream(admin.jetstream())
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
    ["submit", "--model", "cnn", "--gpus", "1", "--iterations", "1"], ["status"],
    ["cancel", "j"], ["drain", "n0"], ["set-policy", "fifo"],
    ["log", "export", "--out", "x"]], ids=lambda a: "-".join(a[:2]) if a[0] == "log" else a[0])
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
            await ensure_stream(js)
            assert (await js.publish(subjects.JOB_SUBMIT, b"{}")).seq == 1
            await publish_denied(nc, errors, subjects.OPERATOR)
        finally:
            await nc.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- what a client is told when the server says no ---------------------------------------------
# One line on stderr naming the cause, exit status 3 (the CLI's status for NATS failures), no
# traceback, and soon. Before: a wrong password read "no servers available", as if no server
# ran; a refused subject "nats: timeout" after 5 s; a certificate the client does not trust
# hung the connect for good (nats-io/nats.py#718); `loom serve` retried a refused login for
# ever; and `loom log export` took no credentials at all.
def run_loom(argv: list[str], env: dict[str, str], cwd: Path,
             timeout: float = 30.0) -> tuple[subprocess.CompletedProcess[str], float]:
    """`loom ARGV` as a process (a hang fails the test instead of stalling the suite), the
    credentials in its environment only, `cwd` as its XDG_RUNTIME_DIR too."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_NATS")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "loom.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**clean, **env, "XDG_RUNTIME_DIR": str(cwd),
                               "PYTHONPATH": str(REPO)})
    return done, time.monotonic() - start


LIVE_COMMANDS = {
    "status": ["status"],
    "submit": ["submit", "--model", "cnn", "--gpus", "1", "--iterations", "5"],
    "cancel": ["cancel", "job-1"],
    "set-policy": ["set-policy", "srtf"],
    "log-export": ["log", "export", "--out", "run.eventlog.gz"],
    "serve": ["serve", "scheduler", "--cluster", "n1g4"],
    "up": ["up", "--local-nodes", "1", "--trainers", "simulated", "--prometheus-port", "0"],
}


@pytest.mark.parametrize("server", ["auth.conf"], indirect=True)  # tls.conf: same accounts
@pytest.mark.parametrize("command", list(LIVE_COMMANDS))
def test_a_wrong_password_is_named_by_every_live_command(
        server: Server, tls: Tls, command: str, tmp_path: Path) -> None:
    env = as_user("scheduler", server, tls, pw="guess").to_env()
    done, took = run_loom([*LIVE_COMMANDS[command], "--nats-url", server.url], env, tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stderr == (f"error: authorization violation at {server.url}: the server "
                           'refused user "scheduler": wrong password, or no such user '
                           "(--nats-user, LOOM_NATS_PASSWORD)\n")
    assert done.stdout == "" and took < 10, took  # `loom up` started nothing


@pytest.mark.parametrize("server", ["auth.conf"], indirect=True)
@pytest.mark.parametrize(("env", "error"), [
    ({}, "the server requires a login and none was given"),
    ({"LOOM_NATS_USER": "submitter"}, 'the server refused user "submitter": no password given'),
], ids=["no-login", "no-password"])
def test_a_missing_login_is_named(server: Server, env: dict[str, str], error: str,
                                  tmp_path: Path) -> None:
    done, _ = run_loom(["status", "--nats-url", server.url], env, tmp_path)
    assert done.returncode == 3
    assert done.stderr.startswith(f"error: authorization violation at {server.url}: {error}"), \
        done.stderr


@pytest.mark.parametrize("server", ["tls.conf"], indirect=True)
@pytest.mark.parametrize(("command", "files", "error"), [
    ("status", {}, "the server's certificate is not trusted"),  # the system CAs do not know it
    ("serve", {}, "the server's certificate is not trusted"),
    ("status", {"tls_ca": "client_cert"}, "the server's certificate is not trusted"),
    ("status", {"tls_ca": "ca"}, "the server requires a client certificate: give "
                                 "--nats-tls-cert and --nats-tls-key"),
], ids=["no-ca", "serve-no-ca", "wrong-ca", "no-client-certificate"])
def test_a_tls_failure_is_named(server: Server, tls: Tls, command: str, files: dict[str, str],
                                error: str, tmp_path: Path) -> None:
    auth = NatsAuth(user="submitter", password=password("submitter"),
                    **{name: str(getattr(tls, attr)) for name, attr in files.items()})
    done, took = run_loom([*LIVE_COMMANDS[command], "--nats-url", server.url], auth.to_env(),
                          tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith(f"error: TLS failure with {server.url}: {error}"), done.stderr
    assert "Traceback" not in done.stderr and took < 10, took


@pytest.mark.parametrize("cut", [BrokenPipeError(32, "Broken pipe"),
                                 ConnectionResetError("Connection lost")], ids=repr)
def test_a_hang_up_after_the_tls_handshake_reads_as_the_missing_certificate(
        cut: OSError) -> None:
    """Under TLS 1.3 the server judges the client certificate after the client's side of the
    handshake: the client hears the alert, or writes into the closed socket first (a race)."""
    from services.runtime.nats_errors import NatsNoServerError, explain

    url = "tls://nats.example:4222"
    no_cert = explain(url, NatsAuth(user="u", tls_ca="ca.pem"), Exception(), [cut])
    assert str(no_cert).startswith(f"TLS failure with {url}: the server requires a client "
                                   "certificate"), no_cert
    refused = explain(url, NatsAuth(tls_ca="ca.pem", tls_cert="c.pem", tls_key="c.key"),
                      Exception(), [cut])
    assert "check the client certificate" in str(refused)
    assert not isinstance(explain("nats://h:4222", NatsAuth(), Exception(), [cut]),
                          NatsNoServerError | type(None))


@pytest.mark.parametrize(("reported", "subject"), [
    ("loom.ops.command", "loom.ops.command"),
    ("$js.api.stream.create.loom", "$JS.API.STREAM.CREATE.LOOM"),
    ("$js.api.consumer.create.loom.abc123.loom.jobs.transition",
     "$JS.API.CONSUMER.CREATE.LOOM.abc123.loom.jobs.transition"),
    ("_inbox.xyz.*", "_INBOX.xyz.*"),
])
def test_the_refused_subject_is_named_in_its_own_case(reported: str, subject: str) -> None:
    """nats-py lower-cases the server's error line; system subjects get their case back."""
    from services.runtime.nats_errors import permission

    assert permission(Exception(f'nats: permissions violation for publish to "{reported}"')) \
        == ("publish", subject)


@pytest.mark.parametrize("server", ["auth.conf"], indirect=True)
@pytest.mark.parametrize(("user", "argv", "subject"), [
    ("submitter", ["cancel", "denied-1"], "loom.ops.command"),
    ("node-n0", ["status"], "loomctl.scheduler.state"),
    ("submitter", ["log", "export", "--out", "x.eventlog"], "$JS.API.STREAM.INFO.LOOM"),
], ids=["submitter-cancels", "node-agent-asks-status", "submitter-exports"])
async def test_a_refused_subject_is_named_at_once(
        server: Server, tls: Tls, user: str, argv: list[str], subject: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The server refuses a publish asynchronously (nats-py's error callback): the command
    fails as soon as it hears of it, naming the subject, instead of timing out."""
    from loom.cli import main

    monkeypatch.chdir(tmp_path)
    admin = await connect("admin", server, tls)
    await ensure_stream(admin.jetstream())
    stop = asyncio.Event()
    scheduler = asyncio.create_task(serve(cluster_opts("scheduler", server, tls), stop))
    try:
        for _ in range(200):
            if await ping(admin, 0.05) == ["scheduler"]:
                break
        submit = ["submit", "--nats-url", server.url, "--model", "cnn", "--gpus", "1",
                  "--iterations", "5", "--job-id", "denied-1",
                  *flags(as_user("submitter", server, tls))]
        assert await asyncio.to_thread(main, submit) == 0
        for _ in range(200):  # the job is known (and pending: no node runs it)
            reply = await admin.request(control_subject("scheduler"), b"", timeout=5)
            if any(j["job_id"] == "denied-1" for j in json.loads(reply.data)["jobs"]):
                break
            await asyncio.sleep(0.02)
        capsys.readouterr()
        start = time.monotonic()
        rc = await asyncio.to_thread(main, [*argv, "--nats-url", server.url,
                                            *flags(as_user(user, server, tls))])
        took = time.monotonic() - start
    finally:
        stop.set()
        await scheduler
        await admin.close()
    err = capsys.readouterr().err
    assert rc == 3, err
    assert err.startswith(f'error: permission denied at {server.url}: user "{user}" may not '
                          f'publish to "{subject}'), err
    assert took < 2.0, took  # a request waits 5 s for a reply before it times out


async def test_log_export_reads_a_secured_stream_with_credentials(
        server: Server, tls: Tls, tmp_path: Path) -> None:
    from loom.cli import main
    from loom.eventlog import read_log

    admin = await connect("admin", server, tls)
    try:
        js = admin.jetstream()
        await ensure_stream(js)
        for n in range(3):
            await js.publish(subjects.JOB_SUBMIT, json.dumps(
                {"model": "m", "gpus": 1, "iterations": n + 1, "iteration_time_s": 1}).encode())
    finally:
        await admin.close()
    out = tmp_path / "secured.eventlog.gz"
    rc = await asyncio.to_thread(main, ["log", "export", "--out", str(out), "--nats-url",
                                        server.url, *flags(as_user("admin", server, tls))])
    assert rc == 0
    log = read_log(out)
    assert [r.subject for r in log.records] == [subjects.JOB_SUBMIT] * 3
    assert [json.loads(r.data)["iterations"] for r in log.records] == [1, 2, 3]
    assert server.violations() == []
