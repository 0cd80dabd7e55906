"""MPS control: the commands `nvidia-cuda-mps-control` takes on stdin, and how they run."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.nodeagent.gpu.interface import GpuBackendError

Runner = Callable[[Sequence[str], str], str]  # (argv, stdin) → stdout


def run_command(argv: Sequence[str], stdin: str = "") -> str:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuBackendError(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise GpuBackendError(f"{' '.join(argv)} exited {done.returncode}: "
                              f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass
class MpsControl:
    """The MPS control daemon of one node (NVIDIA's MPS docs, 'Tools and Interface')."""

    pipe_dir: Path
    log_dir: Path
    run: Runner = run_command
    binary: str = "nvidia-cuda-mps-control"
    started: bool = False
    adopted: bool = False  # the daemon was running already (a previous agent's, say)

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _control(self, command: str) -> str:
        # The control binary reads its pipe location from the environment; pass it as `env`
        # arguments so the runner (and the fake's record) sees the whole command.
        argv = ["env", *(f"{k}={v}" for k, v in self.env.items()), self.binary]
        return self.run(argv, command + "\n")

    def start(self) -> None:
        if self.started:
            return
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = ["env", *(f"{k}={v}" for k, v in self.env.items()), self.binary, "-d"]
        try:
            self.run(argv, "")
        except GpuBackendError as exc:
            # A daemon on these directories already (an agent killed before it could stop
            # its own): use it, as a new one would be used.
            if "already running" not in str(exc):
                raise
            self.adopted = True
        self.started = True

    def stop(self) -> None:
        if self.started:
            self._control("quit")
            self.started = self.adopted = False

    def client_env(self, active_thread_percentage: int) -> dict[str, str]:
        """Environment of a job sharing GPUs through MPS, capped to a share of the SMs."""
        if not 1 <= active_thread_percentage <= 100:
            raise GpuBackendError(
                f"active thread percentage must be 1..100, not {active_thread_percentage}")
        return {**self.env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(active_thread_percentage)}

    def set_default_active_thread_percentage(self, pct: int) -> None:
        self.client_env(pct)  # validates
        self._control(f"set_default_active_thread_percentage {pct}")
