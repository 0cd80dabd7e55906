"""Checkpoint format (versioned), compatibility rules, and the atomic write.

A checkpoint is one file, `DIR/checkpoint.pt`, written by rank 0 with `torch.save` and read with
`torch.load(weights_only=True)`: a dict with `meta` (plain values, validated by
`CheckpointMeta`), `model` and `optimizer` (state dicts). Data-parallel weights are identical
on every rank, so one copy restores at any world size. The data stream is a function of
(seed, global batch, iteration), so a checkpoint restores only with the same model, seed and
global batch size; the world size and the iteration target may change.

Writes are atomic: a temporary file in the same directory, fsync, `os.replace`, fsync of the
directory. A reader sees the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.trainer.errors import CheckpointError

__all__ = ["CheckpointError", "CheckpointMeta", "check_compatible", "load", "pack",
           "param_digest", "save_atomic", "unpack"]

FORMAT: Literal["loom.trainer.checkpoint"] = "loom.trainer.checkpoint"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
FILENAME = "checkpoint.pt"
_TMP_PREFIX = f".{FILENAME}.tmp-"


class CheckpointMeta(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["loom.trainer.checkpoint"] = FORMAT
    version: int = VERSION
    job_id: str
    model: str
    seed: int
    batch_size: int = Field(ge=1)  # global
    iteration: int = Field(ge=0)  # iterations done, the next one to run is this index
    world_size: int = Field(ge=1)  # at write time
    skipped_iterations: int = Field(default=0, ge=0)  # of `iteration`, fast-forwarded ones
    loss: float | None = None  # the last real iteration's global loss
    samples: int | None = Field(default=None, ge=0)  # SDK jobs: data position, in samples
    torch_version: str = ""


def pack(meta: CheckpointMeta, model_state: dict[str, Any],
         optimizer_state: dict[str, Any]) -> dict[str, Any]:
    return {"meta": meta.model_dump(), "model": model_state, "optimizer": optimizer_state}


def unpack(obj: object) -> tuple[CheckpointMeta, dict[str, Any], dict[str, Any]]:
    """Validate a loaded checkpoint's structure and version."""
    if not isinstance(obj, dict) or not {"meta", "model", "optimizer"} <= obj.keys():
        raise CheckpointError("not a Loom trainer checkpoint (missing meta/model/optimizer)")
    raw = obj["meta"]
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"not a Loom trainer checkpoint (format {FORMAT!r} expected)")
    if raw.get("version") not in SUPPORTED_VERSIONS:
        raise CheckpointError(
            f"checkpoint version {raw.get('version')!r} is not supported "
            f"(this trainer reads {SUPPORTED_VERSIONS})"
        )
    try:
        meta = CheckpointMeta.model_validate(raw)
    except ValidationError as exc:
        raise CheckpointError(f"invalid checkpoint metadata: {exc}") from None
    model, optim = obj["model"], obj["optimizer"]
    if not isinstance(model, dict) or not isinstance(optim, dict):
        raise CheckpointError("checkpoint model/optimizer states are not dicts")
    return meta, model, optim


def check_compatible(meta: CheckpointMeta, *, job_id: str, model: str, seed: int,
                     batch_size: int) -> None:
    """Raise `CheckpointError` unless this launch continues the checkpoint's job exactly."""
    wrong = [
        f"{name} {have!r} (checkpoint has {want!r})"
        for name, have, want in (("job id", job_id, meta.job_id), ("model", model, meta.model),
                                 ("seed", seed, meta.seed),
                                 ("global batch size", batch_size, meta.batch_size))
        if have != want
    ]
    if wrong:
        raise CheckpointError("checkpoint belongs to another run: " + ", ".join(wrong))


def path_in(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / FILENAME


def save_atomic(obj: dict[str, Any], directory: str | os.PathLike[str]) -> tuple[Path, int]:
    """Write `obj` as DIR/checkpoint.pt atomically; returns (path, bytes)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / FILENAME
    tmp = d / f"{_TMP_PREFIX}{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final, final.stat().st_size


def load(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The checkpoint in DIR (CPU tensors), or None when there is none.

    Removes temporary files left by a writer that was killed mid-write."""
    d = Path(directory)
    for stale in d.glob(f"{_TMP_PREFIX}*"):
        stale.unlink(missing_ok=True)
    final = d / FILENAME
    if not final.exists():
        return None
    try:
        obj = torch.load(final, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read {final}: {exc}") from exc
    if not isinstance(obj, dict):
        raise CheckpointError(f"{final} is not a Loom trainer checkpoint")
    return obj


def param_digest(params: Iterable[torch.Tensor]) -> str:
    """SHA-256 (16 hex digits) of the parameters' bytes, in order: equal weights, equal digest."""
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
