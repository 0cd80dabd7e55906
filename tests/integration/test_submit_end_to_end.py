"""The README's `loom submit` examples, as written, on `loom up` with real PyTorch trainers:
a bundled model and a job's own command (the SDK example), each to its last iteration.

`loom submit --command` once sent `["submit", "--model", ...]` as the command (exit 127),
and nothing noticed: the other live tests use simulated trainers, which never run a command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.natsserver import free_port

pytestmark = pytest.mark.nats

REPO = Path(__file__).resolve().parents[2]
LOOM = [sys.executable, "-m", "loom.cli"]
README = (REPO / "README.md").read_text()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    # `python` in a job's command is this interpreter, as in an activated virtualenv.
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([*LOOM, "up", "--local-nodes", "1", "--gpus-per-node", "2",
                             "--policy", "tiresias", "--prometheus-port", str(free_port())],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        found = re.search(r"nats://[0-9.]+:[0-9]+", proc.stdout.readline())
        assert found, "loom up printed no URL"
        yield found.group(0), env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def loom(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([*LOOM, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# The README's two submissions, with fewer iterations so that CI runs them in seconds.
BUNDLED = "loom submit --model resnet18 --gpus 2 --iterations 2000 --tenant lab"
OWN = ("loom submit --model mnist-like --gpus 2 --iterations 300 --command python "
       "examples/train_mnist_like.py")


def test_the_readme_submissions_run_to_their_last_iteration(
        live: tuple[str, dict[str, str]]) -> None:
    url, env = live
    assert BUNDLED in README and OWN in README
    ids = {}
    for line, iterations in ((BUNDLED, "12"), (OWN, "20")):
        argv = line.split()[1:]
        argv[argv.index("--iterations") + 1] = iterations
        ids[loom(env, *argv[:1], "--nats-url", url, *argv[1:])] = int(iterations)
    deadline = time.monotonic() + 300  # a failure-only limit: they take seconds
    while True:
        rows = {j["job_id"]: j for j in
                json.loads(loom(env, "status", "--nats-url", url, "--json"))["jobs"]}
        if all(rows.get(i, {}).get("state") in ("finished", "failed") for i in ids):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(1.0)
    for job_id, iterations in ids.items():
        assert (rows[job_id]["state"], rows[job_id]["done"]) == ("finished", iterations), \
            rows[job_id]
