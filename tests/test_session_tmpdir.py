"""The suite's temporary folders (nats-server stores, `loom up` specs, whatever a killed
process leaves) go to one folder per session, removed at teardown (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import os, tempfile
from pathlib import Path

def test_leaves_folders_behind() -> None:
    made = [tempfile.mkdtemp(prefix=p) for p in ("loom-nats-", "loom-up-", "loom-demo-")]
    Path(os.environ["RECORD"]).write_text(" ".join(made))
'''


def test_temporary_folders_go_to_the_session_folder(session_tmpdir: Path) -> None:
    assert Path(tempfile.gettempdir()) == session_tmpdir
    assert os.environ["TMPDIR"] == str(session_tmpdir)


def test_what_a_session_leaves_is_removed_at_teardown(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    record = tmp_path / "made.txt"
    outside = tmp_path / "outside"
    outside.mkdir()
    env = {**os.environ, "RECORD": str(record), "TMPDIR": str(outside),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"),
         str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    made = [Path(p) for p in record.read_text().split()]
    assert len(made) == 3 and all(not p.exists() for p in made)
    assert not any(outside.iterdir())  # nothing went to the TMPDIR the session was given
