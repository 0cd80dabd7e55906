"""Loom's trainer SDK: a user's own PyTorch script, preemptible, resumable and elastic.

    import loom.sdk

    with loom.sdk.session(iterations=500, batch_size=64) as s:
        model, opt = s.restore(model, opt)          # from the newest checkpoint, if any
        model = s.distributed(model)                # DDP when the job has several ranks
        for x, y in s.loader(dataset):              # this rank's slice of each global batch
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            s.step(loss)                            # count, report, stop here on SIGTERM

Launched by Loom's node agent (a job with a `command`) or by torchrun, the session reads its
job from the environment (`LOOM_*`, and torchrun's `RANK`/`WORLD_SIZE`/`MASTER_*`), joins the
process group, and writes the trainer progress protocol (`schemas.trainer`) on rank
0, so the node agent accounts an SDK job exactly as it does Loom's own trainer.

Exact resume at any world size: the loader walks one deterministic sample order (a seeded
permutation per epoch) in global batches, and each rank takes its contiguous slice of the
global batch; the checkpoint stores the position in samples, the iteration, the model,
optimizer and any extra state. A job restarted at another world size (or another global
batch size, as Pollux picks) continues at the same sample with the same weights.

SIGTERM (or SIGINT) after the session has started: the current step finishes, all ranks agree
in `step()` to stop after the same iteration, rank 0 writes the checkpoint atomically, and the
process exits 0 (`Preempted`, a `SystemExit`). Before that (imports, rendezvous, restore) the
signal keeps its default action: nothing has been trained that a checkpoint would keep.

Imports only torch, the standard library and Loom's light trainer modules (pydantic).
See docs/sdk.md.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, TensorDataset, default_collate

from schemas.trainer import Record
from services.trainer import checkpoint
from services.trainer.accounting import STREAM, StepTimes
from services.trainer.accounting import derive_seed as _derive_seed
from services.trainer.channel import Reporter
from services.trainer.comm import Communicator, Local, TorchDistributed
from services.trainer.environment import Environment
from services.trainer.errors import SdkError
from services.trainer.reporting import LaunchReport, Stateful
from services.trainer.stopping import SignalStop

__all__ = ["DataOrder", "Environment", "Preempted", "SdkError", "Session", "session"]


class Preempted(SystemExit):
    """Raised by `Session.step` once the job's checkpoint is written after SIGTERM: exit 0."""

    def __init__(self, iteration: int) -> None:
        super().__init__(0)
        self.iteration = iteration


def session(*, iterations: int | None = None, batch_size: int | None = None,
            name: str | None = None, seed: int = 0, checkpoint_dir: str | Path | None = None,
            checkpoint_every: int = 0, report_interval: float = 2.0,
            backend: str | None = None, exit_fast: bool = True,
            env: Mapping[str, str] | None = None) -> Session:
    """A training session; use it as a context manager around the training loop.

    `iterations` and `batch_size` (the global batch) are the script's defaults: under Loom the
    job's own numbers (`LOOM_ITERATIONS`, `LOOM_BATCH_SIZE`) win. `name` identifies the run in
    its checkpoint (default: the script's file name); `seed` fixes the data order;
    `checkpoint_dir` is used when the launcher gives none (`LOOM_CHECKPOINT_DIR`); without
    either, nothing is saved or restored. `backend` (gloo, nccl) is for the process group the
    session opens when the world size is above 1 and nobody has opened one. `exit_fast`: once
    preempted and checkpointed, end the process at once (`os._exit(0)`), skipping the
    interpreter's teardown of torch (1-2 s; far more on a loaded machine) so the GPUs are free
    sooner; the script's own `finally` blocks and atexit hooks then do not run.
    """
    e = Environment.from_env(env)
    total = e.iterations or iterations
    if total is None or total < 1:
        raise SdkError("session(iterations=...) must be >= 1 (or run under Loom, which sets "
                       "LOOM_ITERATIONS)")
    batch = e.batch_size or batch_size
    if batch is not None and batch < 1:
        raise SdkError(f"session(batch_size={batch}) must be >= 1")
    ckpt = e.checkpoint_dir or (Path(checkpoint_dir) if checkpoint_dir is not None else None)
    if checkpoint_every < 0 or report_interval < 0:
        raise SdkError("checkpoint_every and report_interval must be >= 0")
    return Session(e, iterations=total, batch_size=batch, checkpoint_dir=ckpt,
                   name=name or Path(sys.argv[0] or "script").name, seed=seed,
                   checkpoint_every=checkpoint_every, report_interval=report_interval,
                   backend=backend, exit_fast=exit_fast)


class Session:
    """One launch of the job: made by `session()`, used as a context manager around the loop
    (`restore`, `distributed`, `loader`, `step`); see the module docstring and docs/sdk.md."""

    def __init__(self, env: Environment, *, iterations: int, batch_size: int | None,
                 checkpoint_dir: Path | None, name: str, seed: int, checkpoint_every: int,
                 report_interval: float, backend: str | None, exit_fast: bool = True) -> None:
        self.env = env
        self.job_id = env.job_id
        self.rank = env.rank
        self.world_size = env.world_size
        self.iterations = iterations
        self.default_batch_size = batch_size
        self.checkpoint_dir = checkpoint_dir
        self.name = name
        self.seed = seed
        self.checkpoint_every = checkpoint_every
        self.iteration = 0  # iterations done (restored from the checkpoint)
        self.samples = 0  # position in the data order, in samples
        self.loss: float | None = None  # the last step's global loss
        self.resumed_from: int | None = None  # the world size the checkpoint was written at
        self._backend = backend
        self._exit_fast = exit_fast
        self._comm: Communicator = Local()
        self._own_group = False
        self._reporter: Reporter | None = None  # the channel, on rank 0 when reporting
        self._report = LaunchReport(self._emit, job_id=env.job_id, rank=env.rank,
                                    iterations_total=iterations,
                                    report_every=env.report_every,
                                    report_interval=report_interval)
        self._t0 = time.perf_counter()
        self._state: list[tuple[str, Stateful]] = []
        self._model: torch.nn.Module | None = None
        self._started = False
        self._saved_at: int | None = None
        self._stop = SignalStop()
        self._batch_out = False  # a batch was handed out and its step() not yet called
        self._t_batch = 0.0  # when the current batch was handed out
        self._data_s = 0.0  # how long making it took
        self._t_step = 0.0  # when the previous step ended
        self._active_batch: int | None = None

    # --- the context --------------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self.env.report != "none" and self.rank == 0:
            # Under Loom, stdout carries the protocol: the script's own prints go to stderr.
            self._reporter = Reporter(self.env.report, protect_stdout=True)
        if self.world_size > 1:
            if dist.is_initialized():
                self._comm = TorchDistributed.joined()
            else:
                backend = self._backend or ("nccl" if torch.cuda.is_available() else "gloo")
                for var in ("MASTER_ADDR", "MASTER_PORT"):
                    if var not in os.environ:
                        raise SdkError(f"WORLD_SIZE={self.world_size} but {var} is not set")
                # An explicit timeout: torch's default (30 min) turns a rank that never
                # comes, or a master port someone else holds, into a silent hang.
                dist.init_process_group(
                    backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                    timeout=timedelta(seconds=self.env.rendezvous_timeout_s))
                self._own_group = True
                self._comm = TorchDistributed.joined()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is None:
                self._start()
                self._finish()
            elif not isinstance(exc, SystemExit | KeyboardInterrupt):
                self._report.failed(exc, 1, self.iteration if self._started else None)
        finally:
            self._stop.disarm()
            if self._comm.backend == "gloo" and (exc is None or isinstance(exc, Preempted)):
                _let_gloo_workers_finish()
            if self._own_group and dist.is_initialized():
                dist.destroy_process_group()
            if self._reporter is not None:
                self._reporter.close()
        if isinstance(exc, Preempted) and self._exit_fast:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    # --- restore ------------------------------------------------------------------------------

    def restore(self, model: torch.nn.Module, optimizer: Stateful | None = None,
                *extra: Stateful) -> tuple[Any, ...]:
        """Load the newest checkpoint into `model`, `optimizer` and `extra` (LR schedulers,
        grad scalers: anything with state_dict/load_state_dict); returns (model, optimizer,
        *extra). Rank 0 reads it and sends it to every rank; without one, rank 0's initial
        weights go to every rank. Call it once, before the loop (and before wrapping the
        model in DDP)."""
        if self._started:
            raise SdkError("restore() must come before the first batch")
        self._model = _unwrap(model)
        self._state = [("model", self._model)]
        if optimizer is not None:
            self._state.append(("optimizer", optimizer))
        self._state += [(f"extra{i}", obj) for i, obj in enumerate(extra)]
        found = self._report.restore(self._comm, self.checkpoint_dir, self._model.parameters(),
                                     self._check)
        if found is not None:
            self._load(*found)
        self._start()
        return (model, optimizer, *extra) if optimizer is not None else (model, *extra)

    def _check(self, meta: checkpoint.CheckpointMeta, obj: dict[str, Any]) -> None:
        """The checkpoint is this run's (job, name, seed; the batch may change) and holds
        every state `restore` was given."""
        assert self.checkpoint_dir is not None
        wrong = [f"{what} {have!r} (checkpoint has {want!r})" for what, have, want in (
            ("job id", self.job_id, meta.job_id), ("name", self.name, meta.model),
            ("seed", self.seed, meta.seed)) if have != want]
        if wrong:
            raise checkpoint.CheckpointError(
                f"{checkpoint.path_in(self.checkpoint_dir)} belongs to another run: "
                + ", ".join(wrong))
        missing = [key for key, _ in self._state[1:] if key not in obj]
        if missing:
            raise checkpoint.CheckpointError(f"checkpoint has no state for {missing}")

    def _load(self, meta: checkpoint.CheckpointMeta, obj: dict[str, Any]) -> None:
        for key, target in self._state:
            try:
                target.load_state_dict(obj[key])
            except (RuntimeError, ValueError, KeyError) as exc:
                raise checkpoint.CheckpointError(
                    f"checkpoint {key} state does not fit: {exc}") from exc
        self.iteration = self._saved_at = meta.iteration
        self.samples = (meta.samples if meta.samples is not None
                        else meta.iteration * meta.batch_size)
        self.loss = meta.loss
        self.resumed_from = meta.world_size

    # --- the loop ------------------------------------------------------------------------------

    @property
    def batch_size(self) -> int | None:
        """The global batch size: the scheduler's (LOOM_BATCH_SIZE), else the script's."""
        return self.default_batch_size

    @property
    def done(self) -> bool:
        return self.iteration >= self.iterations

    def distributed(self, model: torch.nn.Module, **ddp: Any) -> torch.nn.Module:
        """`model` wrapped in DistributedDataParallel when the job has several ranks."""
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, **ddp)

    def loader(self, dataset: Dataset[Any] | Sequence[Any], batch_size: int | None = None, *,
               shuffle: bool = True,
               collate: Callable[[list[Any]], Any] = default_collate) -> Iterator[Any]:
        """This rank's slice of each global batch, from the restored position until the job's
        iterations are done. The order is a permutation of the dataset per epoch (seeded by
        the session's seed and the epoch) walked continuously across epochs, so it does not
        depend on the world size or on where the job was stopped. Call `step()` once per
        batch."""
        batch = self.default_batch_size or batch_size  # the session's (the scheduler's) wins
        if batch is None:
            raise SdkError("loader() needs a batch_size (or session(batch_size=...))")
        if batch % self.world_size:
            raise SdkError(f"global batch size {batch} must be divisible by the world size "
                           f"{self.world_size} (each rank takes an equal slice)")
        if not isinstance(dataset, Sized):
            raise SdkError("loader() needs a map-style dataset (with __len__ and __getitem__)")
        n = len(dataset)
        if n == 0:
            raise SdkError("loader(): the dataset is empty")
        self._start()
        self._active_batch = batch
        order = DataOrder(n, self.seed, shuffle)
        while not self.done:
            if self._batch_out:
                raise SdkError("call step(loss) once per batch before taking the next one")
            t0 = time.perf_counter()
            idx = order.slice(self.samples, batch, self.rank, self.world_size)
            if isinstance(dataset, TensorDataset):
                items = tuple(t[idx] for t in dataset.tensors)
            else:
                items = collate([dataset[i] for i in idx])
            self.samples += batch
            self._batch_out = True
            self._t_batch = time.perf_counter()
            self._data_s = self._t_batch - t0
            yield items

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """One iteration done: count it, learn the global loss, report, checkpoint; after
        SIGTERM (on any rank) write the checkpoint and end the process with exit 0."""
        self._start()
        t_compute = time.perf_counter()
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        flag = 1.0 if self._stop.requested else 0.0
        if self.world_size > 1:
            buf = torch.tensor([0.0 if value is None else value, flag], dtype=torch.float64)
            if self._comm.backend == "nccl":
                buf = buf.cuda()
            self._comm.allreduce_sum_(buf)
            total, flag = buf.tolist()
            value = None if value is None else total / self.world_size
        self.iteration += 1
        if not self._batch_out:  # a loop of the script's own: count the default batch
            self._active_batch = self.default_batch_size
            self.samples += self.default_batch_size or 0
            self._t_batch, self._data_s = self._t_step or self._t0, 0.0
        self._batch_out = False
        self.loss = value
        now = time.perf_counter()
        # compute: batch handed out → step() (forward, backward, optimizer, DDP's all-reduce);
        # comm: step()'s own all-reduce of loss and stop flag.
        times = StepTimes(self._data_s, t_compute - self._t_batch, now - t_compute,
                          now - (self._t_step or self._t_batch - self._data_s))
        self._report.step(value, times)
        self._t_step = now
        if flag > 0:
            self._save("preempt")
            self._report.stopped(self.iteration, self._stop.signal or "peer", self.loss,
                                 self._params())
            raise Preempted(self.iteration)
        if self.checkpoint_every and self.iteration % self.checkpoint_every == 0 \
                and not self.done:
            self._save("periodic")
        if self.done or self._report.due(self.iteration, now):
            self._report.progress(self.iteration, now, batch_size=self._active_batch or 0)

    # --- internals ------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._stop.arm()
        now = time.perf_counter()
        self._report.started(
            iteration=self.iteration, now=now, model=self.name, world_size=self.world_size,
            backend=self._comm.backend, device="cuda" if torch.cuda.is_available() else "cpu",
            batch_size=self.default_batch_size or 0, checkpoint_world_size=self.resumed_from,
            startup_s=now - self._t0)

    def _finish(self) -> None:
        self._save("final")
        self._report.finished(self.iteration, self.loss, time.perf_counter() - self._t0,
                              self._params())

    def _save(self, reason: Literal["preempt", "final", "periodic"]) -> None:
        if self._saved_at == self.iteration or self.checkpoint_dir is None or not self._state:
            return
        self._saved_at = self.iteration
        meta = checkpoint.CheckpointMeta(
            job_id=self.job_id, model=self.name, seed=self.seed,
            batch_size=self._active_batch or self.default_batch_size or 1,
            iteration=self.iteration, world_size=self.world_size, loss=self.loss,
            samples=self.samples, torch_version=torch.__version__)
        self._report.save(self.checkpoint_dir, meta, self._state, reason)

    def _params(self) -> Iterator[torch.nn.Parameter] | None:
        return None if self._model is None else self._model.parameters()

    def _emit(self, record: Record) -> None:
        if self._reporter is not None:
            self._reporter.emit(record)


def _let_gloo_workers_finish() -> None:
    """Hand the GIL to gloo's worker threads for a moment before the process group goes.

    A worker that drops the last reference to a collective's tensor needs the GIL to free
    its Python object; the group's teardown (here, or when the script's DDP model is freed)
    joins the workers while holding the GIL. If the last collective's clean-up is still
    waiting then, the process hangs at exit for ever (a known torch teardown hazard: CI and
    `tests/services/trainer/test_sdk.py` hit it in about 1 of 15 two-rank runs)."""
    time.sleep(0.05)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", None)  # DistributedDataParallel, DataParallel
    return inner if isinstance(inner, torch.nn.Module) else model


class DataOrder:
    """The job's sample order: a seeded permutation of the dataset per epoch, walked without
    gaps across epochs. A global batch is `batch` consecutive positions from `start`; rank r
    of W takes the r-th of W equal contiguous parts, so the ranks together see exactly the
    batch a single process would, at any world size."""

    def __init__(self, n: int, seed: int, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self._epoch: tuple[int, list[int]] | None = None

    def slice(self, start: int, batch: int, rank: int, world: int) -> list[int]:
        per_rank = batch // world
        first = start + rank * per_rank
        return [self._at(pos) for pos in range(first, first + per_rank)]

    def _at(self, position: int) -> int:
        epoch, offset = divmod(position, self.n)
        if self._epoch is None or self._epoch[0] != epoch:
            if self.shuffle:
                gen = torch.Generator().manual_seed(_derive_seed(self.seed, STREAM, epoch))
                self._epoch = (epoch, torch.randperm(self.n, generator=gen).tolist())
            else:
                self._epoch = (epoch, list(range(self.n)))
        return self._epoch[1][offset]

