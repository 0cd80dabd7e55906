"""The node agent's supervisor on real subprocesses: launch, lines, graceful stop, kill."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from services.nodeagent.supervisor import LaunchError, ProcessSpec, Supervisor, job_environment


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.exits: list[tuple[str, int]] = []

    def line(self, job: str, text: str) -> None:
        self.lines.append((job, text))

    def exit(self, job: str, code: int) -> None:
        self.exits.append((job, code))


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


# Writes "ready", then on SIGTERM writes a checkpoint file and exits 0.
CHECKPOINTING = """
    import pathlib, signal, sys, time
    def stop(*_):
        pathlib.Path(sys.argv[1]).write_text("checkpoint")
        print("checkpointed", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
"""

STUBBORN = """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
"""


async def wait_for_line(rec: Recorder, text: str, timeout: float = 10.0) -> None:
    async def seen() -> None:
        while not any(line == text for _, line in rec.lines):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(seen(), timeout)


def test_environment_shows_only_the_jobs_gpus_by_uuid() -> None:
    spec = ProcessSpec("j", ["x"], ("GPU-a", "GPU-b"), {"LOOM_JOB": "j"})
    env = job_environment(spec, {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert env == {"PATH": "/bin", "LOOM_JOB": "j", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
                   "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize(("name", "seen"), [
    ("LOOM_NATS_USER", False), ("LOOM_NATS_PASSWORD", False), ("LOOM_NATS_CREDS", False),
    ("LOOM_NATS_TLS_KEY", False), ("LOOM_NATS_NKEY", False), ("AWS_SECRET_ACCESS_KEY", False),
    ("WANDB_API_KEY", False), ("SSH_AUTH_SOCK", False), ("LOOM_ANYTHING", False),
    ("PATH", True), ("HOME", True), ("LANG", True), ("LC_ALL", True), ("NCCL_SOCKET_IFNAME", True),
    ("OMP_NUM_THREADS", True), ("LD_LIBRARY_PATH", True), ("CUDA_HOME", True),
])
def test_a_job_inherits_only_the_allowed_part_of_the_agents_environment(
        name: str, seen: bool) -> None:
    env = job_environment(ProcessSpec("j", ["x"]), {name: "agent's"})
    assert (env.get(name) == "agent's") is seen


def test_a_jobs_own_variables_are_kept_and_the_agents_secrets_are_not() -> None:
    spec = ProcessSpec("j", ["x"], (), {"WANDB_API_KEY": "the job's own"})
    env = job_environment(spec, {"LOOM_NATS_PASSWORD": "s3cret", "WANDB_API_KEY": "agent's"})
    assert env["WANDB_API_KEY"] == "the job's own" and "s3cret" not in env.values()


async def test_a_launched_job_cannot_read_the_agents_credentials(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_NATS_USER", "node-n0")
    monkeypatch.setenv("LOOM_NATS_PASSWORD", "s3cret")
    rec = Recorder()
    sup = Supervisor(rec.line, rec.exit)
    code = "import os; print(sorted(k for k in os.environ if 'NATS' in k))"
    await sup.launch(ProcessSpec("j", python(code)))
    assert await sup.wait("j") == 0
    assert rec.lines == [("j", "[]")]


async def test_a_job_runs_to_the_end_with_its_lines_and_exit_code() -> None:
    rec = Recorder()
    sup = Supervisor(rec.line, rec.exit)
    code = """
        import os
        print("gpus", os.environ["CUDA_VISIBLE_DEVICES"])
        print("done")
        raise SystemExit(3)
    """
    await sup.launch(ProcessSpec("j1", python(code), ("GPU-x",)))
    assert await sup.wait("j1") == 3
    assert rec.lines == [("j1", "gpus GPU-x"), ("j1", "done")]
    assert rec.exits == [("j1", 3)]
    assert sup.running == {}


async def test_stop_lets_the_trainer_checkpoint_within_the_grace_period(tmp_path: Path) -> None:
    rec = Recorder()
    sup = Supervisor(rec.line, rec.exit, grace_s=10.0)
    ckpt = tmp_path / "ckpt"
    await sup.launch(ProcessSpec("j", [*python(CHECKPOINTING), str(ckpt)]))
    await wait_for_line(rec, "ready")
    assert await sup.stop("j") == 0
    assert ckpt.read_text() == "checkpoint"
    assert ("j", "checkpointed") in rec.lines and rec.exits == [("j", 0)]


async def test_a_trainer_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    rec = Recorder()
    sup = Supervisor(rec.line, rec.exit)
    await sup.launch(ProcessSpec("j", python(STUBBORN)))
    await wait_for_line(rec, "ready")
    assert await sup.stop("j", grace_s=0.3) == -signal.SIGKILL


async def test_stop_reaches_the_trainers_children_and_nothing_else(tmp_path: Path) -> None:
    rec = Recorder()
    sup = Supervisor(rec.line, rec.exit)
    pidfile = tmp_path / "child"
    parent = f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        print("ready", flush=True)
        time.sleep(60)
    """
    bystander = await asyncio.create_subprocess_exec(sys.executable, "-c",
                                                     "import time; time.sleep(60)")
    try:
        await sup.launch(ProcessSpec("j", python(parent)))
        await wait_for_line(rec, "ready")
        child = int(pidfile.read_text())
        await sup.stop_all(grace_s=5.0)
        for _ in range(200):  # the child is reparented and reaped by init: poll
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the trainer's child outlived the stop")
        assert bystander.returncode is None  # not started by the supervisor: untouched
    finally:
        bystander.kill()
        await bystander.wait()


async def test_launch_errors_name_the_job() -> None:
    rec = Recorder()
    sup = Supervisor(rec.line, rec.exit)
    with pytest.raises(LaunchError, match="job a: cannot run '/no/such/trainer'"):
        await sup.launch(ProcessSpec("a", ["/no/such/trainer"]))
    with pytest.raises(LaunchError, match="job b: empty command"):
        await sup.launch(ProcessSpec("b", []))
    await sup.launch(ProcessSpec("c", python(STUBBORN)))
    with pytest.raises(LaunchError, match="job c is already running here"):
        await sup.launch(ProcessSpec("c", python(STUBBORN)))
    await sup.stop_all(grace_s=0.2)
    assert await sup.stop("unknown") is None
