"""What one launch of a training job says on its report channel, and its checkpoints.

Loom's bundled trainer (`runner.Trainer`) and the trainer SDK (`loom.sdk.Session`) both go
through `LaunchReport`, so the two write the same protocol records (`schemas.trainer`) with
the same accounting (report windows, stage times) and the same checkpoint files
(`checkpoint.py`); each keeps only what differs: its loop, and what its checkpoint must match.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol

import torch

from schemas.trainer import (
    Checkpointed,
    Failed,
    Finished,
    Progress,
    Record,
    Started,
    Stopped,
)
from services.trainer import checkpoint
from services.trainer.accounting import ReportClock, StageAccount, StepTimes, Window
from services.trainer.comm import Communicator, share_from_rank0

__all__ = ["LaunchReport", "Stateful"]

Reason = Literal["preempt", "final", "periodic"]


class Stateful(Protocol):
    """What a checkpoint saves and restores: a model, an optimizer, an LR scheduler, ..."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class LaunchReport:
    """The records of one launch of one rank, in the protocol's order, and its checkpoints.

    `started` opens the first report window; `step` adds an iteration's loss and measured
    stages; `progress` (when `due`, and at the end) closes the window; `stopped`, `finished`
    or `failed` ends the launch. `save` writes a checkpoint (rank 0) and reports it; `restore`
    reads the newest one on rank 0 and gives it to every rank."""

    def __init__(self, emit: Callable[[Record], None], *, job_id: str, rank: int,
                 iterations_total: int, report_every: int, report_interval: float) -> None:
        self.emit = emit
        self.job_id = job_id
        self.rank = rank
        self.iterations_total = iterations_total
        self._every = report_every
        self._interval = report_interval
        self.profile = StageAccount()  # this launch's measured iterations
        self._window = Window(started_at=0.0, start_iteration=0)
        self._clock = ReportClock(report_every, report_interval, 0, 0.0)

    # --- records ------------------------------------------------------------------------------

    def started(self, *, iteration: int, now: float, model: str, world_size: int, backend: str,
                device: str, batch_size: int, checkpoint_world_size: int | None,
                startup_s: float) -> None:
        self.open_window(iteration, now)
        self._clock = ReportClock(self._every, self._interval, iteration, now)
        self.emit(Started(
            job_id=self.job_id, rank=self.rank, ts=time.time(), model=model,
            world_size=world_size, backend=backend, device=device, batch_size=batch_size,
            iteration=iteration, iterations_total=self.iterations_total,
            resumed=checkpoint_world_size is not None,
            checkpoint_world_size=checkpoint_world_size, startup_s=startup_s))

    def open_window(self, iteration: int, now: float) -> None:
        """Start a report window here (fast-forward's rate is not the real steps')."""
        self._window = Window(started_at=now, start_iteration=iteration)

    def step(self, loss: float | None, times: StepTimes | None) -> None:
        """An iteration done: its global loss, and its stage times unless it is not measured
        (a warm-up iteration)."""
        if loss is not None:
            self._window.add_loss(loss)
        if times is not None:
            self._window.stages.add(times)
            self.profile.add(times)

    def due(self, iteration: int, now: float) -> bool:
        return self._clock.due(iteration, now)

    def progress(self, iteration: int, now: float, *, batch_size: int,
                 fast_forward: bool = False) -> None:
        """Report the window up to `iteration` and open the next. A fast-forwarded window
        carries the launch's measured stages: it computed nothing to measure."""
        rate = self._window.throughput(iteration, now)
        self.emit(Progress(
            job_id=self.job_id, rank=self.rank, ts=time.time(), iteration=iteration,
            iterations_total=self.iterations_total, loss=self._window.loss(), throughput=rate,
            samples_per_s=rate * batch_size, fast_forward=fast_forward,
            stages=self.profile.summary() if fast_forward else self._window.stages.summary()))
        self._clock.mark(iteration, now)
        self.open_window(iteration, now)

    def stopped(self, iteration: int, signal: str, loss: float | None,
                params: Iterable[torch.Tensor] | None) -> None:
        self.emit(Stopped(job_id=self.job_id, rank=self.rank, ts=time.time(),
                          iteration=iteration, signal=signal, loss=loss,
                          param_digest=_digest(params), profile=self.profile.summary()))

    def finished(self, iteration: int, loss: float | None, wall_s: float,
                 params: Iterable[torch.Tensor] | None) -> None:
        self.emit(Finished(job_id=self.job_id, rank=self.rank, ts=time.time(),
                           iteration=iteration, loss=loss, wall_s=wall_s,
                           param_digest=_digest(params), profile=self.profile.summary()))

    def failed(self, exc: BaseException, exit_code: int, iteration: int | None) -> None:
        self.emit(Failed(job_id=self.job_id, rank=self.rank, ts=time.time(),
                         reason=str(exc) or type(exc).__name__, error=type(exc).__name__,
                         exit_code=exit_code, iteration=iteration))

    # --- checkpoints --------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike[str], meta: checkpoint.CheckpointMeta,
             state: Sequence[tuple[str, Stateful]], reason: Reason) -> Checkpointed | None:
        """Rank 0 writes `state` (`model`, then `optimizer` if any, then extras under their own
        keys) atomically and reports it; other ranks write nothing (None)."""
        if self.rank != 0:
            return None
        t0 = time.perf_counter()
        states = {key: obj.state_dict() for key, obj in state}
        obj = checkpoint.pack(meta, states.pop("model"), states.pop("optimizer", {}))
        obj.update(states)
        path, size = checkpoint.save_atomic(obj, directory)
        record = Checkpointed(job_id=self.job_id, rank=self.rank, ts=time.time(),
                              iteration=meta.iteration, reason=reason, path=str(path),
                              bytes=size, write_s=time.perf_counter() - t0)
        self.emit(record)
        return record

    def restore(self, comm: Communicator, directory: str | os.PathLike[str] | None,
                params: Iterable[torch.Tensor],
                check: Callable[[checkpoint.CheckpointMeta, dict[str, Any]], None],
                ) -> tuple[checkpoint.CheckpointMeta, dict[str, Any]] | None:
        """The newest checkpoint in `directory` on every rank: rank 0 reads it and `check`s
        it belongs to this job (raising `CheckpointError`), so only rank 0 needs the disk.
        Without one, rank 0's `params` go to every rank, and None comes back."""
        def read() -> dict[str, Any] | None:
            assert directory is not None
            obj = checkpoint.load(directory)
            if obj is not None:
                check(checkpoint.unpack(obj)[0], obj)
            return obj

        reads = self.rank == 0 and directory is not None
        payload = share_from_rank0(comm, read if reads else None, params)
        if payload is None:
            return None
        meta, _, _ = checkpoint.unpack(payload)
        assert isinstance(payload, dict)
        return meta, payload


def _digest(params: Iterable[torch.Tensor] | None) -> str:
    return "" if params is None else checkpoint.param_digest(params)
