"""`loom up` says how to reach it: the URL, a ready `nats pub` line, a NATS CLI context file;
its embedded server takes NATS's standard port 4222 when free, any free port otherwise."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loom.up import EXAMPLE_JOB, UpOptions, _embedded_nats, reach_text, write_nats_context
from schemas.cluster import ClusterSpec
from schemas.codec import decode_submission
from schemas.job import SubmitJob
from services.runtime.nats_auth import NatsAuth
from services.runtime.natsserver import free_port

URL = "nats://127.0.0.1:4222"


def test_the_example_job_is_a_valid_submission() -> None:
    body = decode_submission(EXAMPLE_JOB.encode(), fallback_id="x", now=0.0,
                             producer="p").body
    assert isinstance(body, SubmitJob) and body.model == "resnet18"


@pytest.mark.parametrize(("auth", "keys"), [
    (NatsAuth(), {"description", "url"}),
    (NatsAuth(user="ops", password="pw"), {"description", "url", "user", "password"}),
    (NatsAuth(creds="/x.creds", tls_ca="/ca.pem"), {"description", "url", "creds", "ca"}),
])
def test_the_context_file_is_what_the_nats_cli_reads(tmp_path: Path, auth: NatsAuth,
                                                     keys: set[str]) -> None:
    path = write_nats_context(tmp_path / "loom.json", URL, auth)
    context = json.loads(path.read_text())
    assert set(context) == keys and context["url"] == URL
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it may hold a password


def test_the_printed_text_has_the_url_a_nats_pub_line_and_where_nats_comes_from() -> None:
    opts = UpOptions(ClusterSpec.uniform(1, 1, 2), "x", prometheus_port=9464)
    text = reach_text(URL, 4, opts, Path("/run/loom-0/loom.json"))
    assert URL in text and "http://127.0.0.1:9464/metrics" in text
    assert "nats --context /run/loom-0/loom.json pub loom.jobs.submit '{\"model\"" in text
    assert "github.com/nats-io/natscli" in text


async def test_the_preferred_port_when_free_any_port_when_not() -> None:
    wanted = free_port()
    server = await _embedded_nats(wanted)
    try:
        assert server.port == wanted
    finally:
        await server.stop()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        server = await _embedded_nats(busy)
        try:
            assert server.port != busy
        finally:
            await server.stop()


def test_loom_up_prints_how_to_reach_it(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loom.cli", "up", "--local-nodes", "1", "--gpus-per-node", "1",
         "--trainers", "simulated", "--prometheus-port", "0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "natscli" in line:
                break
        text = "".join(lines)
        context = Path(text.split("nats --context ", 1)[1].split()[0])
        url = json.loads(context.read_text())["url"]
        assert f"on {url}" in text and "pub loom.jobs.submit" in text
        assert context.parent == tmp_path / f"loom-{os.getuid()}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not context.exists()  # gone with the cluster
    # "cluster up" is news, not a problem: logged at info, so not at the default level.
    assert proc.stderr is not None and "cluster up" not in proc.stderr.read()
