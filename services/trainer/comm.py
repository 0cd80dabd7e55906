"""Data-parallel communication: torch.distributed (gloo, nccl) or Horovod, behind one interface.

The loop all-reduces one flat buffer per step (all gradients, then the loss and the stop flag),
as Horovod's fusion buffer does, so the communication stage is one timed call and every rank
learns the global loss and whether any rank was asked to stop.

Rendezvous is torch's TCP store at `--master-addr:--master-port` (rank 0 listens), so ranks can
be on different nodes. World size 1 opens no process group. Horovod is imported only when asked
for; it brings its own rendezvous (launch the ranks with `horovodrun`, which sets its
environment), and the trainer checks that its rank and size match the flags.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from services.trainer.errors import BackendUnavailable, CheckpointError

__all__ = ["BackendUnavailable", "Communicator", "Horovod", "Local", "TorchDistributed",
           "connect", "resolve_backend", "resolve_device", "share_from_rank0"]


class Communicator(Protocol):
    backend: str
    rank: int
    world_size: int

    def allreduce_sum_(self, buf: Tensor) -> None: ...

    def broadcast_object(self, obj: object) -> object: ...

    def broadcast_(self, tensors: Sequence[Tensor]) -> None: ...

    def close(self) -> None: ...


class Local:
    """World size 1: nothing to communicate."""

    backend = "local"
    rank = 0
    world_size = 1

    def allreduce_sum_(self, buf: Tensor) -> None:
        return None

    def broadcast_object(self, obj: object) -> object:
        return obj

    def broadcast_(self, tensors: Sequence[Tensor]) -> None:
        return None

    def close(self) -> None:
        return None


class TorchDistributed:
    def __init__(self, backend: str, master_addr: str, master_port: int, rank: int,
                 world_size: int, timeout_s: float) -> None:
        if backend == "gloo" and not dist.is_gloo_available():
            raise BackendUnavailable("torch.distributed was built without gloo")
        if backend == "nccl" and not dist.is_nccl_available():
            raise BackendUnavailable("torch.distributed has no NCCL here (a CPU build?)")
        host = f"[{master_addr}]" if ":" in master_addr else master_addr
        dist.init_process_group(
            backend=backend, init_method=f"tcp://{host}:{master_port}", rank=rank,
            world_size=world_size, timeout=timedelta(seconds=timeout_s),
        )
        self.backend = backend
        self.rank = rank
        self.world_size = world_size

    @classmethod
    def joined(cls) -> TorchDistributed:
        """The default process group someone else (torchrun, a user script) initialised."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed has no default process group")
        self = cls.__new__(cls)
        self.backend = str(dist.get_backend())
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        return self

    def allreduce_sum_(self, buf: Tensor) -> None:
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)

    def broadcast_object(self, obj: object) -> object:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_(self, tensors: Sequence[Tensor]) -> None:
        for t in tensors:
            dist.broadcast(t, src=0)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class Horovod:
    def __init__(self, rank: int, world_size: int) -> None:
        try:
            self._hvd: Any = importlib.import_module("horovod.torch")
        except ImportError as exc:
            raise BackendUnavailable(
                f"--backend horovod: cannot import horovod.torch ({exc}); it is optional and "
                "built separately, or use --backend gloo/nccl"
            ) from None
        self._hvd.init()
        self.backend = "horovod"
        self.rank = int(self._hvd.rank())
        self.world_size = int(self._hvd.size())
        if (self.rank, self.world_size) != (rank, world_size):
            raise BackendUnavailable(
                f"horovod says rank {self.rank} of {self.world_size}, the flags say {rank} of "
                f"{world_size}: launch ranks with horovodrun and matching flags"
            )

    def allreduce_sum_(self, buf: Tensor) -> None:
        self._hvd.allreduce_(buf, op=self._hvd.Sum)

    def broadcast_object(self, obj: object) -> object:
        result: object = self._hvd.broadcast_object(obj, root_rank=0)
        return result

    def broadcast_(self, tensors: Sequence[Tensor]) -> None:
        for t in tensors:
            self._hvd.broadcast_(t, root_rank=0)

    def close(self) -> None:
        self._hvd.shutdown()


def resolve_device(requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)  # the node agent narrows CUDA_VISIBLE_DEVICES
    if requested == "cuda":
        raise BackendUnavailable("--device cuda: no CUDA device is visible")
    return torch.device("cpu")


def resolve_backend(requested: str, device: torch.device) -> str:
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        raise BackendUnavailable("--backend nccl needs a CUDA device; use gloo on CPU")
    return requested


def connect(backend: str, *, master_addr: str, master_port: int, rank: int, world_size: int,
            timeout_s: float) -> Communicator:
    if backend == "horovod":
        return Horovod(rank, world_size)
    if world_size == 1:
        return Local()
    return TorchDistributed(backend, master_addr, master_port, rank, world_size, timeout_s)


def share_from_rank0(comm: Communicator, read: Callable[[], object] | None,
                     params: Iterable[Tensor]) -> object:
    """What rank 0's `read` returns (the newest checkpoint, or None), on every rank, so no
    disk need be shared; `read` is None on the other ranks. A checkpoint rank 0 cannot use
    fails every rank alike. With none, rank 0's initial weights go to every rank (they are
    equal anyway)."""
    payload: object = None
    if read is not None:
        try:
            payload = read()
        except CheckpointError as exc:
            payload = f"error: {exc}"
    payload = comm.broadcast_object(payload)
    if isinstance(payload, str):
        raise CheckpointError(payload.removeprefix("error: "))
    if payload is None:
        with torch.no_grad():
            comm.broadcast_([p.data for p in params])
    return payload
