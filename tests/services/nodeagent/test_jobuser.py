"""`--job-user`: the agent starts jobs as an unprivileged user, which cannot read what the
agent can. Runs where the test process may switch users (root, as on CI); skipped elsewhere."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.nodeagent.jobuser import CAP_CHOWN, CAP_KILL, CAP_SETGID, CAP_SETUID, JobUser
from services.nodeagent.supervisor import ProcessSpec, Supervisor

ALL = 1 << CAP_CHOWN | 1 << CAP_KILL | 1 << CAP_SETGID | 1 << CAP_SETUID
can_switch = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@pytest.mark.parametrize(("name", "caps", "uid", "error"), [
    ("no-such-user-here", ALL, 0,
     "--job-user 'no-such-user-here': no such user on this host"),
    ("root", ALL, 0, "--job-user 'root' is root: jobs must not run as root"),
    # A non-root agent with the capabilities would hand them to the job: refused.
    ("nobody", ALL, 999, "the node agent must run as root to start jobs as another user "
                         r"\(it runs as uid 999\)"),
    ("nobody", 1 << CAP_SETUID | 1 << CAP_SETGID, 0, "lacks CAP_CHOWN, CAP_KILL;"),
    ("nobody", 0, 0, "lacks CAP_CHOWN, CAP_KILL, CAP_SETGID, CAP_SETUID"),
])
def test_an_unusable_job_user_is_named(name: str, caps: int, uid: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        JobUser.lookup(name, capabilities=caps, agent_uid=uid)


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, job: str, text: str) -> None:
        self.lines.append(text)

    def exit(self, job: str, code: int) -> None:
        pass


@pytest.fixture
def secret() -> Iterator[Path]:
    """A file only the agent's user may read, as its credentials are (mode 0600)."""
    folder = Path(tempfile.mkdtemp(prefix="loom-agent-"))
    folder.chmod(0o755)
    path = folder / "nodeagent.env"
    path.write_text("LOOM_NATS_PASSWORD=s3cret\n")
    path.chmod(0o600)
    yield path
    path.unlink()
    folder.rmdir()


@can_switch
async def test_a_job_runs_as_the_job_user_and_cannot_read_the_agents_secrets(
        secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/root")
    user = JobUser.lookup("nobody")
    rec = Recorder()
    sup = Supervisor(rec.line, rec.exit, job_user=user)
    script = (f'id -u; echo "$HOME $USER"; cat {secret} 2>/dev/null || echo unreadable; '
              "grep -E '^Cap(Eff|Prm|Amb)' /proc/self/status")
    await sup.launch(ProcessSpec("j", ["/bin/sh", "-c", script]))
    assert await sup.wait("j") == 0
    assert rec.lines[:3] == [str(user.uid), f"{user.home} {user.name}", "unreadable"]
    # No privilege passed on: the job holds no capability at all.
    assert [line.split()[1] for line in rec.lines[3:]] == ["0" * 16] * 3


@can_switch
def test_the_checkpoint_directory_is_handed_to_the_job_user(tmp_path: Path) -> None:
    user = JobUser.lookup("nobody")
    ckpt = tmp_path / "job-1"
    ckpt.mkdir()
    user.hand_over(ckpt)
    info = ckpt.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (user.uid, user.gid, 0o700)


def test_loom_serve_names_an_unusable_job_user_before_connecting() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "loom.cli", "serve", "nodeagent", "--cluster", "n1g4",
         "--node", "n0", "--fake-gpus", "4", "--job-user", "no-such-user-here",
         "--nats-url", "nats://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--job-user 'no-such-user-here': no such user on this host" in done.stderr
    assert "Traceback" not in done.stderr
