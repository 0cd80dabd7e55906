"""The node agent's shell: runs the core's `Spawn`/`Kill` through the process supervisor and
feeds the trainers' protocol records and exit codes back to the core.

Checkpoint hand-over between nodes: a job stopped on one node may be launched on another
before the first has written its checkpoint. Rank 0 of a job therefore holds an exclusive
lock on `<checkpoint dir>/.rank0.lock` from before it starts until it has exited; a new rank 0
(on any node sharing the checkpoint directory) waits for the lock, so it always resumes from
the last checkpoint. The lock is `fcntl.flock`, which NFSv4 also honours.

Health: before it takes work the shell runs the doctor's checks (`services.nodeagent.doctor`)
through its own GPU backend and MPS control; every heartbeat then carries the cheap checks'
results and the latest of the others (re-run in the background every few minutes), and the
scheduler cordons the node, or takes single GPUs out of service, while one fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from schemas import trainer as protocol
from schemas.events import GpuSample, HealthProblem, NodeHealth
from services.nodeagent.agent import Kill, SampleGpus, Spawn, TrainerNodeCore
from services.nodeagent.doctor import Doctor, DoctorConfig
from services.nodeagent.gpu import FakeBackend, GpuBackend, MpsControl, run_command
from services.nodeagent.health_monitor import HealthMonitor
from services.nodeagent.jobuser import JobUser
from services.nodeagent.probes import RealHost, host_for
from services.nodeagent.supervisor import ProcessSpec, Supervisor
from services.runtime.bus import Bus
from services.runtime.clock import Clock
from services.runtime.effects import Effect
from services.runtime.service import Shell

LOCK_NAME = ".rank0.lock"
LOCK_WAIT_S = 600.0


def process_key(job_id: str, rank: int) -> str:
    return f"{job_id}#{rank}"


def split_key(key: str) -> tuple[str, int]:
    job_id, _, rank = key.rpartition("#")
    return job_id, int(rank)


class NodeAgentShell(Shell):
    core: TrainerNodeCore

    def __init__(self, core: TrainerNodeCore, bus: Bus, clock: Clock, *, run_id: str,
                 backend: GpuBackend, cwd: Path | None = None,
                 job_user: JobUser | None = None, health_checks: bool = True) -> None:
        super().__init__(core, bus, clock, run_id=run_id)
        self.backend = backend
        mps_dir = core.settings.mps_dir / core.node.node_id
        # The fake backend records MPS commands instead of running them (no GPU, no daemon).
        runner = backend.run if isinstance(backend, FakeBackend) else run_command
        self.mps = MpsControl(mps_dir / "pipe", mps_dir / "log", run=runner)
        self.supervisor = Supervisor(self._on_line, self._on_exit,
                                     grace_s=core.settings.grace_s, job_user=job_user)
        self.cwd = cwd
        self._locks: dict[str, IO[bytes]] = {}  # job → its held rank-0 lock
        self._pending: set[asyncio.Task[None]] = set()
        self.monitor: HealthMonitor | None = None
        self._backend_closed = False
        if health_checks:
            settings = core.settings
            host = host_for(backend, RealHost(settings.python, nc=getattr(bus, "nc", None)))
            self.monitor = HealthMonitor(Doctor(
                backend, host, self.mps,
                DoctorConfig(checkpoint_root=settings.checkpoint_root,
                             expect_gpus=core.node.gpus),
                keep_mps=True))

    async def start(self) -> None:
        """The doctor's checks first (logged; a failure cordons the node once the first
        heartbeat reports it), then the node takes part in the cluster."""
        if self.monitor is not None:
            try:
                await self.monitor.startup()
            except Exception as exc:  # the checks must never keep the agent from starting
                self._log("error", "health checks failed to run",
                          reason=f"{type(exc).__name__}: {exc}")
        await super().start()

    async def apply(self, effects: list[Effect], cause: str | None) -> None:
        rest: list[Effect] = []
        for eff in effects:
            if isinstance(eff, Spawn):
                self._background(self._spawn(eff))
            elif isinstance(eff, Kill):
                self._background(self._kill(eff))
            elif isinstance(eff, SampleGpus):
                if not self._backend_closed:  # a heartbeat timer may fire after stop()
                    rest += self.core.on_telemetry(self._sample(), self._health())
            else:
                rest.append(eff)
        await super().apply(rest, cause)

    def _background(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _spawn(self, eff: Spawn) -> None:
        key = process_key(eff.job_id, eff.rank)
        try:
            if eff.rank == 0:
                self._locks[eff.job_id] = await _lock(Path(eff.checkpoint_dir), LOCK_WAIT_S)
                if self.supervisor.job_user is not None:
                    self.supervisor.job_user.hand_over(Path(eff.checkpoint_dir))
            env = {**dict(eff.env), "LOOM_JOB_ID": eff.job_id}
            if eff.mps_percentage is not None:
                self.mps.start()  # idempotent: one daemon per node
                env.update(self.mps.client_env(eff.mps_percentage))
            cwd = Path(eff.cwd) if eff.cwd is not None else self.cwd
            await self.supervisor.launch(ProcessSpec(key, eff.argv, eff.gpu_uuids, env, cwd))
        except Exception as exc:  # the job cannot start here: the core learns it as an exit
            self._log("error", "spawn failed", job=eff.job_id, rank=eff.rank,
                      reason=f"{type(exc).__name__}: {exc}")
            self._release(eff.job_id, eff.rank)
            await self._feed(self.core.on_exit(eff.job_id, eff.rank, 127))

    def _sample(self) -> list[GpuSample]:
        try:
            return [GpuSample(uuid=t.uuid,
                              utilization_ratio=min(1.0, max(0.0, t.utilization_ratio)),
                              memory_used_bytes=t.memory_used_bytes)
                    for t in self.backend.telemetry()]
        except Exception as exc:  # telemetry is best effort; the heartbeat still goes out
            self._log("warning", "GPU telemetry failed", reason=f"{type(exc).__name__}: {exc}")
            return []

    def _health(self) -> NodeHealth | None:
        if self.monitor is None:
            return None
        try:
            return self.monitor.beat()
        except Exception as exc:  # the heartbeat goes out whatever the checks do
            self._log("warning", "health checks failed", reason=f"{type(exc).__name__}: {exc}")
            return NodeHealth(problems=(HealthProblem(
                check="driver", status="warn",
                detail=f"the checks failed to run: {type(exc).__name__}: {exc}"[:1024]),))

    async def _kill(self, eff: Kill) -> None:
        await self.supervisor.stop(process_key(eff.job_id, eff.rank), eff.grace_s)

    async def _on_line(self, key: str, line: str) -> None:
        job_id, rank = split_key(key)
        try:
            record = protocol.decode(line)
        except ValidationError:
            self._log("info", "trainer output", job=job_id, rank=rank, line=line[:500])
            await self._feed(self.core.on_output(job_id, rank, line))
            return
        await self._feed(self.core.on_record(job_id, rank, record))

    async def _on_exit(self, key: str, code: int) -> None:
        job_id, rank = split_key(key)
        self._release(job_id, rank)
        await self._feed(self.core.on_exit(job_id, rank, code))

    async def _feed(self, effects: list[Effect]) -> None:
        try:
            await self.apply(effects, None)
        except Exception as exc:  # never let one job's trouble stop the agent
            self.errors += 1
            self._log("error", "node agent effect failed", reason=f"{type(exc).__name__}: {exc}")

    def _release(self, job_id: str, rank: int) -> None:
        if rank == 0:
            handle = self._locks.pop(job_id, None)
            if handle is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()

    async def stop(self) -> None:
        """Stop every trainer this agent started (each checkpoints), then let go of locks."""
        await self.supervisor.stop_all()
        if self.monitor is not None:
            await self.monitor.stop()
        self._backend_closed = True
        with contextlib.suppress(Exception):
            self.mps.stop()
        with contextlib.suppress(Exception):
            self.backend.close()
        for task in list(self._pending):
            task.cancel()
        for job_id in list(self._locks):
            self._release(job_id, 0)


async def _lock(directory: Path, wait_s: float, poll_s: float = 0.05) -> IO[bytes]:
    """The job's rank-0 lock, waiting (without blocking the loop) for a previous holder."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / LOCK_NAME, "ab")  # noqa: SIM115 - held until rank 0 exits
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if asyncio.get_running_loop().time() > deadline:
                handle.close()
                raise TimeoutError(f"{directory / LOCK_NAME} still held after {wait_s}s "
                                   "(the job's previous run has not exited)") from None
            await asyncio.sleep(poll_s)
