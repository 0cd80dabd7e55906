"""The node agent's process supervisor: launch trainers on their GPUs, watch them, stop them.

Each job runs in its own session (process group), so stopping it reaches every process the
trainer forked (data loaders, torchrun workers), and cleaning up never touches a process the
agent did not start. A stop is graceful first: SIGTERM, a grace period for the trainer to
write its checkpoint, then SIGKILL.

The supervisor reports through two callbacks: every line the trainer writes to stdout (the
trainer's progress protocol) and its exit code once it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.nodeagent.jobuser import JobUser
from services.runtime.logging import get_logger

log = get_logger("nodeagent.supervisor")

LineHandler = Callable[[str, str], Awaitable[None] | None]  # (job id, line)
ExitHandler = Callable[[str, int], Awaitable[None] | None]  # (job id, exit code; <0: signal)


class LaunchError(RuntimeError):
    """A job could not be started (already running here, bad command, no such binary)."""


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    job_id: str
    argv: Sequence[str]
    gpu_uuids: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None


@dataclass
class _Running:
    spec: ProcessSpec
    process: asyncio.subprocess.Process
    reader: asyncio.Task[None]
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    code: int | None = None


# What a job inherits from the agent's environment: the locale, the search paths, and the
# operator's tuning of the libraries it trains with. Nothing else: the agent's environment
# holds its NATS credentials (LOOM_NATS_*), and a job is a tenant's code. As Slurm's
# `--export=NONE` plus a site list, or a Kubernetes pod's env, which starts empty.
INHERITED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "HOSTNAME", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV",
})
INHERITED_PREFIXES = ("LC_", "CUDA_", "NCCL_", "GLOO_", "NVIDIA_", "OMP_", "MKL_", "OPENBLAS_",
                      "TORCH_", "UCX_", "FI_")


def inherited(name: str) -> bool:
    """Whether a job sees the agent's variable `name` (never one of Loom's own)."""
    return not name.startswith("LOOM_") and (name in INHERITED
                                             or name.startswith(INHERITED_PREFIXES))


def job_environment(spec: ProcessSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trainer's environment: the allowed part of the agent's, the job's own variables,
    and only its GPUs visible.

    GPUs are named by UUID: indices change under MPS and across reboots, UUIDs do not.
    """
    source = os.environ if base is None else base
    env = {name: value for name, value in source.items() if inherited(name)}
    env.update(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpu_uuids)
    env["PYTHONUNBUFFERED"] = "1"  # progress lines must arrive as they are written
    return env


class Supervisor:
    def __init__(self, on_line: LineHandler, on_exit: ExitHandler,
                 grace_s: float = 30.0, job_user: JobUser | None = None) -> None:
        self._on_line = on_line
        self._on_exit = on_exit
        self.grace_s = grace_s
        self.job_user = job_user  # None: jobs run as the agent's user
        self._jobs: dict[str, _Running] = {}

    @property
    def running(self) -> dict[str, int]:
        """Job id → PID of the trainer processes still alive."""
        return {jid: r.process.pid for jid, r in self._jobs.items() if r.code is None}

    async def launch(self, spec: ProcessSpec) -> int:
        if spec.job_id in self._jobs and self._jobs[spec.job_id].code is None:
            raise LaunchError(f"job {spec.job_id} is already running here "
                              f"(pid {self._jobs[spec.job_id].process.pid})")
        if not spec.argv:
            raise LaunchError(f"job {spec.job_id}: empty command")
        env = job_environment(spec)
        who: dict[str, object] = {}
        if self.job_user is not None:
            env.update(self.job_user.identity())
            who = {"user": self.job_user.uid, "group": self.job_user.gid, "extra_groups": []}
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.argv, env=env, cwd=spec.cwd, stdout=asyncio.subprocess.PIPE,
                stderr=None, start_new_session=True, **who)  # type: ignore[arg-type]
        except OSError as exc:
            raise LaunchError(f"job {spec.job_id}: cannot run {spec.argv[0]!r}: {exc}") from exc
        run = _Running(spec, process, asyncio.create_task(self._follow(spec.job_id, process)))
        self._jobs[spec.job_id] = run
        log.info("launched", job=spec.job_id, pid=process.pid, gpus=list(spec.gpu_uuids))
        return process.pid

    async def _follow(self, job_id: str, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line:
                await _call(self._on_line, job_id, line)
        code = await process.wait()
        run = self._jobs[job_id]
        run.code = code
        run.exited.set()
        log.info("exited", job=job_id, pid=process.pid, code=code)
        await _call(self._on_exit, job_id, code)

    async def stop(self, job_id: str, grace_s: float | None = None) -> int | None:
        """SIGTERM the job's process group, SIGKILL it after the grace period; its exit code.

        None when the agent runs no such job (already gone, or never started here).
        """
        run = self._jobs.get(job_id)
        if run is None:
            return None
        if run.code is None:
            grace = self.grace_s if grace_s is None else grace_s
            self._signal(run, signal.SIGTERM)
            try:
                await asyncio.wait_for(run.exited.wait(), grace)
            except TimeoutError:
                log.warning("grace period over, killing", job=job_id, grace_s=grace)
                self._signal(run, signal.SIGKILL)
                await run.exited.wait()
        await run.reader
        self._jobs.pop(job_id, None)
        return run.code

    async def wait(self, job_id: str) -> int | None:
        """Wait for a job to exit by itself; its exit code."""
        run = self._jobs.get(job_id)
        if run is None:
            return None
        await run.reader
        self._jobs.pop(job_id, None)
        return run.code

    async def stop_all(self, grace_s: float | None = None) -> dict[str, int | None]:
        """Stop every job this supervisor started (and only those)."""
        jobs = list(self._jobs)
        codes = await asyncio.gather(*(self.stop(j, grace_s) for j in jobs))
        return dict(zip(jobs, codes, strict=True))

    @staticmethod
    def _signal(run: _Running, sig: signal.Signals) -> None:
        # The whole session: a trainer's own children go too. It may be gone by now.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, sig)


async def _call(handler: Callable[..., Awaitable[None] | None], *args: object) -> None:
    result = handler(*args)
    if result is not None:
        await result
