"""The trainer's progress protocol: one JSON object per line, typed records, version 1.

The node agent reads these lines from the trainer's report channel (stdout by default; see
`--report`). Each record has `v` (protocol version), `event` (which record), `job_id`, `rank`
and `ts` (wall-clock seconds since the epoch, stamped by the trainer). Every rank writes its
own stream; rank 0's is the one to account progress by (all ranks agree on iterations, loss and
when to stop).

A launch writes, in order: `started`, then `progress` records, optionally `checkpointed`
(periodic), and ends with exactly one of:

* `checkpointed` (reason `preempt`, rank 0 only) + `stopped`: SIGTERM/SIGINT arrived; the
  current step finished, the checkpoint is on disk, the process exits 0;
* `checkpointed` (reason `final`, rank 0 only) + `finished`: all iterations done, exit 0;
* `failed`: exit 1 (a runtime error: rendezvous timeout, a peer died, ...) or exit 2 (the
  launch can never work: invalid arguments, incompatible checkpoint, unavailable backend).

This module imports neither torch nor anything heavy, so a node agent can use `decode`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL_VERSION: Literal[1] = 1


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = PROTOCOL_VERSION
    job_id: str
    rank: int = Field(ge=0)
    ts: float


class StageTimes(BaseModel):
    """Mean seconds per iteration of each stage over measured (post-warm-up) iterations.

    `data_s`: producing the batch and moving it to the device (Muri's resource_time_0);
    `compute_s`: forward, backward and the optimizer update (resource_time_1);
    `comm_s`: the gradient all-reduce, including waiting for slower ranks (resource_time_2;
    0 at world size 1); `iteration_s`: wall time of a whole iteration (≥ the sum).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    iterations: int = Field(ge=0)
    data_s: float = Field(ge=0)
    compute_s: float = Field(ge=0)
    comm_s: float = Field(ge=0)
    iteration_s: float = Field(ge=0)


class Started(_Record):
    event: Literal["started"] = "started"
    model: str
    world_size: int = Field(ge=1)
    backend: str  # "local" (world size 1, no process group), "gloo", "nccl", "horovod"
    device: str
    batch_size: int  # global batch, split evenly across ranks
    iteration: int = Field(ge=0)  # iterations already done (0, or the checkpoint's)
    iterations_total: int = Field(ge=1)
    resumed: bool
    checkpoint_world_size: int | None = None  # the world size the checkpoint was written at
    startup_s: float  # main() entry → ready to train: imports, rendezvous, build, restore


class Progress(_Record):
    event: Literal["progress"] = "progress"
    iteration: int = Field(ge=0)
    iterations_total: int = Field(ge=1)
    loss: float | None  # mean global-batch loss over the window's real iterations
    throughput: float  # iterations per second over the window (wall clock)
    samples_per_s: float  # throughput × global batch size
    fast_forward: bool  # the window advanced without computing (at the measured rate)
    stages: StageTimes | None  # None while only warm-up iterations have run


class Checkpointed(_Record):
    event: Literal["checkpointed"] = "checkpointed"
    iteration: int = Field(ge=0)
    reason: Literal["preempt", "final", "periodic"]
    path: str
    bytes: int = Field(ge=0)
    write_s: float


class Stopped(_Record):
    event: Literal["stopped"] = "stopped"
    iteration: int = Field(ge=0)
    signal: str  # the signal's name, or "peer" when another rank was signalled
    loss: float | None
    param_digest: str
    profile: StageTimes | None  # this launch's measured stage times


class Finished(_Record):
    event: Literal["finished"] = "finished"
    iteration: int = Field(ge=0)
    loss: float | None
    wall_s: float  # main() entry → finished
    param_digest: str  # SHA-256 prefix of the parameters: equal on every rank
    profile: StageTimes | None


class Failed(_Record):
    event: Literal["failed"] = "failed"
    reason: str
    error: str  # the exception type, or "invalid_arguments"
    exit_code: int
    iteration: int | None = None


Record = Annotated[
    Started | Progress | Checkpointed | Stopped | Finished | Failed, Field(discriminator="event")
]
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Record)


def encode(record: Record) -> str:
    """One protocol line, newline included."""
    return record.model_dump_json() + "\n"


def decode(line: str | bytes) -> Record:
    """Parse and validate one protocol line (raises `pydantic.ValidationError`)."""
    return _ADAPTER.validate_json(line)
