"""The training loop of one rank: restore, train (or fast-forward), report, checkpoint.

One iteration: draw the global batch of this iteration from the seed and take this rank's
slice (data), forward + backward (compute), pack every gradient plus the loss and the stop flag
into one buffer and all-reduce it (communication), average, optimizer step (compute). Because
the stop flag travels with the gradients, all ranks stop after the same iteration, whichever
rank got the signal. On CUDA every stage boundary synchronises the device, as Muri's testbed
workload does, so the stage times are device times.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from domain.trainer_config import TrainerConfig
from schemas.trainer import Record
from services.runtime.logging import get_logger
from services.trainer import checkpoint, workloads
from services.trainer.accounting import STREAM, FastForward, StepTimes, derive_seed
from services.trainer.comm import Communicator
from services.trainer.errors import TrainingFailed
from services.trainer.reporting import LaunchReport

_log = get_logger("services.trainer")

# A fast-forward chunk lasts about this long; ranks agree on stopping between chunks.
_FF_CHUNK_S = 0.1


class StopSource(Protocol):
    """Set by the shell's signal handlers once armed."""

    requested: bool
    signal: str | None

    def arm(self) -> None: ...


@dataclass(frozen=True)
class Outcome:
    kind: Literal["finished", "stopped"]
    iteration: int


class Trainer:
    def __init__(self, cfg: TrainerConfig, comm: Communicator, device: torch.device,
                 emit: Callable[[Record], None], stop: StopSource, t_main: float) -> None:
        self.cfg = cfg
        self.comm = comm
        self.device = device
        self.report = LaunchReport(emit, job_id=cfg.job_id, rank=comm.rank,
                                   iterations_total=cfg.iterations,
                                   report_every=cfg.report_every,
                                   report_interval=cfg.report_interval)
        self.stop = stop
        self.t_main = t_main
        self.rank = comm.rank
        self.world = comm.world_size
        self.workload = workloads.make(cfg.model, cfg.seed, cfg.data)
        self.model = self.workload.init_model(cfg.seed).to(device)
        self.optimizer = self.workload.optimizer(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.iteration = 0
        self.skipped = 0
        self.loss: float | None = None
        self.saved_iteration: int | None = None
        self.checkpoint_world: int | None = None
        self.started = False

    # --- restore --------------------------------------------------------------------------

    def restore(self) -> None:
        """Rank 0 reads the checkpoint, if any, and sends it to every rank (no shared disk
        needed); without one, rank 0's initial weights are broadcast (they are equal anyway)."""
        found = self.report.restore(self.comm, self.cfg.checkpoint_dir, self.params,
                                    self._check)
        if found is None:
            return
        meta, obj = found
        try:
            self.model.load_state_dict(obj["model"])
            self.optimizer.load_state_dict(obj["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise checkpoint.CheckpointError(f"checkpoint does not fit the model: {exc}") from exc
        self.iteration = self.saved_iteration = meta.iteration
        self.skipped = meta.skipped_iterations
        self.loss = meta.loss
        self.checkpoint_world = meta.world_size

    def _check(self, meta: checkpoint.CheckpointMeta, obj: object) -> None:
        """The checkpoint continues this job: same job, model, seed and global batch."""
        checkpoint.check_compatible(meta, job_id=self.cfg.job_id, model=self.cfg.model,
                                    seed=self.cfg.seed, batch_size=self.cfg.batch_size)

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            return self._run()
        except Exception as exc:
            raise TrainingFailed(self.iteration if self.started else None, exc) from exc

    def _run(self) -> Outcome:
        cfg = self.cfg
        self.restore()
        self.stop.arm()
        self.started = True
        now = time.perf_counter()
        self.report.started(
            iteration=self.iteration, now=now, model=cfg.model, world_size=self.world,
            backend=self.comm.backend, device=str(self.device), batch_size=cfg.batch_size,
            checkpoint_world_size=self.checkpoint_world, startup_s=now - self.t_main)
        _log.info("started", iteration=self.iteration, world_size=self.world,
                  backend=self.comm.backend, resumed=self.checkpoint_world is not None)
        stopped = self._train()
        if stopped is None and cfg.fast_forward and self.iteration < cfg.iterations:
            stopped = self._fast_forward()
        if stopped is not None:
            return self._stopped(stopped)
        return self._finished()

    def _train(self) -> str | None:
        """Real iterations until done, stopped (returns the signal) or time to fast-forward."""
        cfg = self.cfg
        per_rank = cfg.batch_size // self.world
        shard = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        sizes = [p.numel() for p in self.params]
        n = sum(sizes)
        buf = torch.zeros(n + 2, device=self.device)
        ff_after = cfg.warmup + cfg.fast_forward if cfg.fast_forward else math.inf
        steps = 0
        while self.iteration < cfg.iterations and steps < ff_after:
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(derive_seed(cfg.seed, STREAM, self.iteration))
            batch = tuple(t[shard].to(self.device)
                          for t in self.workload.make_batch(gen, cfg.batch_size))
            t1 = self._sync()
            self.optimizer.zero_grad()
            loss = self.workload.loss(self.model, batch)
            loss.backward()  # type: ignore[no-untyped-call]
            t2 = self._sync()
            if self.world > 1:
                self._pack(buf, sizes, loss)
                self.comm.allreduce_sum_(buf)
                buf.div_(self.world)
                self._unpack(buf, sizes)
                loss_value, stop_any = buf[n:].tolist()
                stop = stop_any > 0
            else:
                loss_value, stop = loss.item(), self.stop.requested
            t3 = self._sync()
            self.optimizer.step()
            t4 = self._sync()
            self.iteration += 1
            steps += 1
            self.loss = float(loss_value)
            measured = steps > cfg.warmup
            self.report.step(self.loss, StepTimes(t1 - t0, (t2 - t1) + (t4 - t3), t3 - t2,
                                                  t4 - t0) if measured else None)
            if stop:
                return self.stop.signal or "peer"
            if (cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0
                    and self.iteration < cfg.iterations):
                self._save("periodic")
            now = time.perf_counter()
            last = self.iteration >= cfg.iterations or steps >= ff_after
            if last or self.report.due(self.iteration, now):
                self.report.progress(self.iteration, now, batch_size=cfg.batch_size)
        return None

    def _fast_forward(self) -> str | None:
        """Count iterations at the measured rate without computing (weights stay as after the
        last real step). Ranks agree on the rate (their mean) and, per chunk, on stopping."""
        measured = self.report.profile.summary()
        rate = torch.tensor([measured.iteration_s if measured else 0.0], device=self.device)
        self.comm.allreduce_sum_(rate)
        iteration_s = float(rate[0]) / self.world
        flag = torch.zeros(1, device=self.device)
        now = time.perf_counter()
        ff = FastForward(self.iteration, now, iteration_s, self.cfg.iterations)
        chunk = max(1, math.ceil(_FF_CHUNK_S / iteration_s)) if iteration_s > 0 else 1
        self.report.open_window(self.iteration, now)
        _log.info("fast_forward", iteration=self.iteration, iteration_s=iteration_s)
        while self.iteration < self.cfg.iterations:
            target = min(self.cfg.iterations, self.iteration + chunk)
            delay = ff.time_of(target) - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.skipped += target - self.iteration
            self.iteration = target
            flag.fill_(1.0 if self.stop.requested else 0.0)
            self.comm.allreduce_sum_(flag)
            if float(flag.item()) > 0:
                return self.stop.signal or "peer"
            now = time.perf_counter()
            if self.iteration >= self.cfg.iterations or self.report.due(self.iteration, now):
                self.report.progress(self.iteration, now, batch_size=self.cfg.batch_size,
                                     fast_forward=True)
        return None

    # --- endings ----------------------------------------------------------------------------

    def _stopped(self, signal: str) -> Outcome:
        if self.saved_iteration != self.iteration:
            self._save("preempt")
        self.report.stopped(self.iteration, signal, self.loss, self.params)
        _log.info("stopped", iteration=self.iteration, signal=signal)
        return Outcome("stopped", self.iteration)

    def _finished(self) -> Outcome:
        if self.saved_iteration != self.iteration:
            self._save("final")
        self.report.finished(self.iteration, self.loss, time.perf_counter() - self.t_main,
                             self.params)
        _log.info("finished", iteration=self.iteration, loss=self.loss)
        return Outcome("finished", self.iteration)

    # --- helpers ----------------------------------------------------------------------------

    def _save(self, reason: Literal["preempt", "final", "periodic"]) -> None:
        self.saved_iteration = self.iteration
        meta = checkpoint.CheckpointMeta(
            job_id=self.cfg.job_id, model=self.cfg.model, seed=self.cfg.seed,
            batch_size=self.cfg.batch_size, iteration=self.iteration, world_size=self.world,
            skipped_iterations=self.skipped, loss=self.loss, torch_version=torch.__version__,
        )
        done = self.report.save(self.cfg.checkpoint_dir, meta,
                                [("model", self.model), ("optimizer", self.optimizer)], reason)
        if done is not None:
            _log.info("checkpointed", iteration=self.iteration, reason=reason,
                      write_s=done.write_s)

    def _pack(self, buf: Tensor, sizes: list[int], loss: Tensor) -> None:
        off = 0
        for p, k in zip(self.params, sizes, strict=True):
            grad = p.grad
            if grad is None:
                buf[off:off + k].zero_()
            else:
                buf[off:off + k].copy_(grad.reshape(-1))
            off += k
        buf[off] = loss.detach()
        buf[off + 1] = 1.0 if self.stop.requested else 0.0

    def _unpack(self, buf: Tensor, sizes: list[int]) -> None:
        off = 0
        for p, k in zip(self.params, sizes, strict=True):
            if p.grad is not None:
                p.grad.copy_(buf[off:off + k].view_as(p))
            off += k

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
