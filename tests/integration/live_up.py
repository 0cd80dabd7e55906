"""`loom up` as an operator starts it, for the tests that drive a whole live cluster, and the
plain job they gate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOOM = [sys.executable, "-m", "loom.cli"]

# An unmodified job: counts, prints its progress in Loom's form, and waits for the file
# $GATE before its last iteration, so a test decides when it ends.
GATED_SCRIPT = """
import os, pathlib, time
n, gate = int(os.environ["LOOM_ITERATIONS"]), pathlib.Path(os.environ["GATE"])
for i in range(1, n + 1):
    while i == n and not gate.exists():
        time.sleep(0.05)
    time.sleep(0.02)
    print(f"LOOM_PROGRESS iteration={i} loss={1 / i:.4f}", flush=True)
"""


@contextmanager
def loom_up(runtime_dir: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`loom up ARGS`, its URL record under `runtime_dir`; yields it and its NATS URL once
    every service answers, and kills it if the test left it running."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir)}
    proc = subprocess.Popen([*LOOM, "up", *args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once every service answers PING
        found = re.search(r"nats://[0-9.]+:[0-9]+", line)
        assert found, f"loom up printed {line!r}"
        yield proc, found.group(0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
