"""Jobs: what a user submits and the lifecycle states the scheduler tracks."""

from __future__ import annotations

import enum
import itertools
import math
import re
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

# Bounds on user input: generous for real clusters (the bundled traces peak at 8.7e8
# iterations, 1.1e7 s and 100 epochs), tight enough to stop garbage before a policy sees it.
MAX_GPUS = 4096
MAX_NAME = 128
MAX_ITERATIONS = 10**12
MAX_SECONDS = 1e12  # any time or duration: about 31,700 years
MAX_BATCH = 2**24
MAX_PRIORITY = 10**6
MAX_WEIGHT = 1e6
MAX_RATE = 1e9  # iterations per second in a profile
MAX_STAGES = 16
MAX_GPU_TYPES = 64
MAX_PROFILE_POINTS = 4096  # epochs of a goodput profile; entries of a scaling table
MAX_BATCH_SIZES = 256
MAX_FAIL_MARKS = 4096  # recorded failures of one job (a production trace's failed attempts)

NAME_PATTERN = r"^[A-Za-z0-9_.:\-/]+$"
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)]
# A job's id, the one rule every service and the CLI use: it names the job's checkpoint
# directory, its processes and its durable state, so it has no path separator and cannot be
# "." or ".." (it starts with a letter or digit).
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
JobId = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=JOB_ID_PATTERN)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0, le=MAX_RATE, allow_inf_nan=False)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]

_JOB_ID: TypeAdapter[str] = TypeAdapter(JobId)


def valid_job_id(job_id: str) -> str:
    """`job_id` if it keeps the rule, else a ValueError naming it."""
    try:
        return _JOB_ID.validate_python(job_id)
    except ValidationError as exc:
        raise ValueError(f"job id {job_id!r}: {exc.errors()[0]['msg']}") from None


# A job may run its own command (an "unmodified job", see docs/sdk.md): bounded like the rest.
MAX_ARGS = 256
MAX_ARG = 4096
MAX_ENV = 64
Arg = Annotated[str, Field(min_length=1, max_length=MAX_ARG)]
EnvName = Annotated[str, Field(min_length=1, max_length=MAX_NAME,
                                pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, Field(max_length=MAX_ARG)]
# Set by the node agent for every rank; a job's `env` may not override them.
RESERVED_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED",
})
RESERVED_ENV_PREFIXES = ("LOOM_", "PET_")


class GoodputProfile(BaseModel):
    """A job's goodput model (Pollux, OSDI'21), for schedulers that adapt its batch size.

    `perf` are the step-time parameters (alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r,
    gamma) of Pollux's throughput model, fitted to the job type's profile; `epochs` the
    cumulative statistical progress (steps at `init_batch`, weighted by efficiency) at the end
    of each epoch (the job is done at the last); `grad_sqr`/`grad_var` the gradient statistics
    measured during each epoch (columns) at each of `batch_sizes` (rows). A job measures its
    progress in these units (`iterations` is the total, rounded up); see `domain.goodput`.
    `adaptive` is False for a job whose batch size is fixed (its `batch_size`) whatever the
    scheduler does.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    perf: tuple[float, float, float, float, float, float, float]
    init_batch: Batch
    max_batch: Batch
    min_local_batch: Batch
    max_local_batch: Batch
    epochs: tuple[float, ...] = Field(min_length=1, max_length=MAX_PROFILE_POINTS)
    batch_sizes: tuple[Batch, ...] = Field(min_length=1, max_length=MAX_BATCH_SIZES)
    # One row per batch size, one column per epoch (checked below).
    grad_sqr: tuple[tuple[float, ...], ...] = Field(max_length=MAX_BATCH_SIZES)
    grad_var: tuple[tuple[float, ...], ...] = Field(max_length=MAX_BATCH_SIZES)
    adaptive: bool = True

    @model_validator(mode="after")
    def _check(self) -> GoodputProfile:
        if not all(p > 0 and math.isfinite(p) for p in self.perf):
            raise ValueError("perf parameters must be finite and > 0")
        if not 1.0 <= self.perf[6] <= 10.0:
            raise ValueError(f"gamma (perf[6]) must be in [1, 10], got {self.perf[6]}")
        if self.init_batch > self.max_batch:
            raise ValueError(f"init_batch ({self.init_batch}) exceeds max_batch ({self.max_batch})")
        if self.min_local_batch > self.max_local_batch:
            raise ValueError("min_local_batch exceeds max_local_batch")
        if any(b <= a for a, b in zip(self.epochs, self.epochs[1:], strict=False)) or \
                not (self.epochs[0] > 0 and math.isfinite(self.epochs[-1])):
            raise ValueError("epochs must be finite, positive and increasing")
        if any(b <= a for a, b in zip(self.batch_sizes, self.batch_sizes[1:], strict=False)):
            raise ValueError("batch_sizes must be increasing")
        shape = (len(self.batch_sizes), len(self.epochs))
        for name, table in (("grad_sqr", self.grad_sqr), ("grad_var", self.grad_var)):
            if len(table) != shape[0] or any(len(row) != shape[1] for row in table):
                raise ValueError(f"{name} must have one row per batch size and one column per "
                                 f"epoch ({shape[0]} x {shape[1]})")
            if not all(v >= 0 and math.isfinite(v) for row in table for v in row):
                raise ValueError(f"{name} must be finite and >= 0")
        return self


class _JobFields(BaseModel):
    """Fields a job has however it arrives; times in seconds.

    `iteration_time_s` is the solo time of one iteration at `gpus` GPUs; `stage_times_s`
    optionally splits it into per-resource stages (data loading, GPU compute, gradient
    communication) for interleaving policies. On a heterogeneous cluster `throughputs` gives
    the job's iterations per second at `gpus` GPUs on each GPU type (0: cannot run there), from
    a profile such as Gavel's; `job_type` names the profiled workload ("ResNet-50 (batch size
    64)") so co-location profiles can be looked up. An elastic job has `scaling`: its
    iterations per second (the whole job) at each GPU count it may run with (ElasticFlow's
    throughput tables); a scheduler may then give it any of those counts within
    [`min_gpus`, `max_gpus`]. A job with a `goodput` profile (Pollux's workloads) progresses
    in statistical units at a speed that depends on its GPUs, nodes, batch size and epoch.

    `fail_at` replays the failures a production trace records (`loom sim --replay-failures`):
    the progress marks (iterations done) at which the job's trainer fails on its own, strictly
    increasing, each in (0, `iterations`]. The job is retried from an earlier mark (the trace
    restarted it) and fails for good at a mark equal to `iterations`. Only simulated node
    agents can make a trainer fail on cue, so a live cluster refuses such a job.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: Name = "default"
    model: Name
    batch_size: Batch | None = None
    gpus: int = Field(ge=1, le=MAX_GPUS)
    min_gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS)
    max_gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS)
    iterations: int = Field(ge=1, le=MAX_ITERATIONS)
    iteration_time_s: float = Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    stage_times_s: tuple[Seconds, ...] | None = Field(default=None, max_length=MAX_STAGES)
    deadline_s: float | None = Field(default=None, ge=-MAX_SECONDS, le=MAX_SECONDS,
                                     allow_inf_nan=False)
    best_effort: bool = False
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT, allow_inf_nan=False)  # Gavel's share
    gpu_type: Name | None = None
    job_type: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    throughputs: dict[Name, Rate] | None = Field(default=None, max_length=MAX_GPU_TYPES)
    scaling: dict[Annotated[int, Field(ge=1, le=MAX_GPUS)], Rate] | None = Field(
        default=None, max_length=MAX_PROFILE_POINTS)
    duration_s: Seconds | None = None
    goodput: GoodputProfile | None = None
    # Unmodified jobs: the argv to run per rank instead of Loom's bundled trainer, extra
    # environment, working directory, and how to read progress from its stdout.
    command: tuple[Arg, ...] | None = Field(default=None, min_length=1, max_length=MAX_ARGS)
    env: dict[EnvName, EnvValue] | None = Field(default=None, max_length=MAX_ENV)
    cwd: str | None = Field(default=None, min_length=1, max_length=MAX_ARG)
    progress_regex: str | None = Field(default=None, min_length=1, max_length=512)
    # Not empty (checked below: a min_length here adds a second, misleading error to any
    # bad mark's).
    fail_at: tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...] | None = Field(
        default=None, max_length=MAX_FAIL_MARKS)

    @model_validator(mode="after")
    def _check_command(self) -> _JobFields:
        if self.command is None:
            extras = [n for n in ("env", "cwd", "progress_regex") if getattr(self, n) is not None]
            if extras:
                raise ValueError(f"{', '.join(extras)} only apply to a job with a command")
            return self
        if self.cwd is not None and not self.cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path, got {self.cwd!r}")
        reserved = sorted(k for k in self.env or {}
                          if k in RESERVED_ENV or k.startswith(RESERVED_ENV_PREFIXES))
        if reserved:
            raise ValueError(f"env: {', '.join(reserved)} are set by Loom's node agent")
        if self.progress_regex is not None:
            try:
                pattern = re.compile(self.progress_regex)
            except re.error as exc:
                raise ValueError(f"progress_regex does not compile: {exc}") from None
            if "iteration" not in pattern.groupindex:
                raise ValueError("progress_regex needs a named group (?P<iteration>...)")
        return self

    @model_validator(mode="after")
    def _check_bounds(self) -> _JobFields:
        if self.min_gpus is not None and self.min_gpus > self.gpus:
            raise ValueError(f"min_gpus ({self.min_gpus}) exceeds gpus ({self.gpus})")
        if self.max_gpus is not None and self.max_gpus < self.gpus:
            raise ValueError(f"max_gpus ({self.max_gpus}) is below gpus ({self.gpus})")
        if self.stage_times_s is not None and any(t < 0 for t in self.stage_times_s):
            raise ValueError("stage_times_s must be non-negative")
        if self.scaling is not None:
            bad_counts = [g for g, v in self.scaling.items()
                          if g < 1 or not (v >= 0 and math.isfinite(v))]
            if bad_counts:
                raise ValueError(f"scaling: GPU counts must be >= 1 with finite rates >= 0 "
                                 f"(at {bad_counts})")
        if self.throughputs is not None:
            bad = [t for t, v in self.throughputs.items() if not (v >= 0 and math.isfinite(v))]
            if bad:
                raise ValueError(f"throughputs must be finite and >= 0 (GPU types {bad})")
            if not any(v > 0 for v in self.throughputs.values()):
                raise ValueError("throughputs: the job cannot run on any GPU type")
        if self.fail_at is not None:
            _check_fail_at(self.fail_at, self.iterations)
        return self

    @property
    def gpu_levels(self) -> tuple[int, ...]:
        """GPU counts the job may run with: its scaling profile's (within min/max), else its own."""
        if self.scaling is None:
            return (self.gpus,)
        lo = self.min_gpus or 1
        hi = self.max_gpus or max(self.scaling)
        return tuple(sorted(g for g, v in self.scaling.items() if v > 0 and lo <= g <= hi))

    def iteration_time_at(self, gpus: int, gpu_type: str | None = None) -> float:
        """Seconds per iteration with `gpus` GPUs (an elastic job's profile, else as requested)."""
        if self.scaling is not None and gpus in self.scaling:
            rate = self.scaling[gpus]
            return 1.0 / rate if rate > 0 else math.inf
        return self.iteration_time_on(gpu_type)

    def iteration_time_on(self, gpu_type: str | None) -> float:
        """Seconds per iteration on `gpu_type` (inf where the profile says it cannot run)."""
        if self.throughputs is None or gpu_type is None:
            return self.iteration_time_s
        rate = self.throughputs.get(gpu_type)
        if rate is None:
            return self.iteration_time_s  # unprofiled type: the trace's own iteration time
        return 1.0 / rate if rate > 0 else math.inf


def _check_fail_at(marks: tuple[float, ...], iterations: int) -> None:
    """Marks a run can reach in order: each later than the one before, none past the end."""
    if not marks:
        raise ValueError("fail_at needs at least one mark (leave it out for a job that "
                         "does not fail)")
    for before, after in itertools.pairwise(marks):
        if after <= before:
            raise ValueError(f"fail_at must be strictly increasing ({after:g} follows "
                             f"{before:g})")
    if marks[-1] > iterations:
        raise ValueError(f"fail_at: mark {marks[-1]:g} is past the job's iterations "
                         f"({iterations}); each mark is in (0, iterations]")


class JobSpec(_JobFields):
    """A training job as the scheduler knows it: named and stamped."""

    job_id: JobId
    submit_time_s: Seconds

    @property
    def work_s(self) -> float:
        """Solo run time at the requested GPU count."""
        return self.iterations * self.iteration_time_s


class SubmitJob(_JobFields):
    """A submission as people type it (`nats pub loom.jobs.submit '{...}'`).

    `job_id` and `submit_time_s` may be left out: the scheduler assigns an id and stamps the
    time it received the submission.
    """

    job_id: JobId | None = None
    submit_time_s: Seconds | None = None
    # The spec this submission was made from in this process (an injector's trace job): valid
    # already, so the scheduler takes that very object, neither copied nor checked again. A
    # submission decoded from the wire has none, and is validated field by field.
    _spec: JobSpec | None = PrivateAttr(default=None)

    def to_spec(self, job_id: str, now: float) -> JobSpec:
        # Read from the private slot: `self._spec` runs pydantic's `__getattr__` in Python.
        origin: JobSpec | None = (self.__pydantic_private__ or {}).get("_spec")
        if origin is not None:
            return origin
        data = self.model_dump()
        data["job_id"] = self.job_id or job_id
        data["submit_time_s"] = now if self.submit_time_s is None else self.submit_time_s
        return JobSpec(**data)

    @classmethod
    def from_spec(cls, spec: JobSpec) -> SubmitJob:
        """What `model_construct(**spec.__dict__)` builds, without its Python pass over every
        field (a tenth of the time, paid per job): a spec's fields are this model's, valid."""
        sub = cls.__new__(cls)
        fields = dict(spec.__dict__)
        set_slot = object.__setattr__
        set_slot(sub, "__dict__", fields)
        set_slot(sub, "__pydantic_fields_set__", set(fields))
        set_slot(sub, "__pydantic_extra__", None)
        set_slot(sub, "__pydantic_private__", {"_spec": spec})
        return sub

    def __eq__(self, other: object) -> bool:  # the in-process origin is not part of it
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return super().__hash__()


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    FAILED = "failed"
    REJECTED = "rejected"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def waiting(self) -> bool:
        return self in WAITING_STATES


# The sets the properties test, for code that tests many states (a compiled core's membership
# test costs a fraction of a call into the enum's Python property).
TERMINAL_STATES = frozenset({JobState.FINISHED, JobState.FAILED, JobState.REJECTED})
WAITING_STATES = frozenset({JobState.QUEUED, JobState.PREEMPTED})
