"""Versioned event bodies and the envelope every message travels in.

An event type is `loom.<noun>.<verb>.v<N>`. A breaking change adds a `v(N+1)` body and keeps
decoding `vN`; `EVENT_TYPES` maps each accepted type to its body model.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.causes import Cause
from schemas.job import JobId, JobSpec, JobState, SubmitJob
from schemas.queue_status import QueueStatus
from schemas.status import Status

# A placement: for each node, the GPU indices the job holds there.
GpuSlots = tuple[tuple[str, tuple[int, ...]], ...]


def gpu_count(slots: GpuSlots) -> int:
    """How many GPUs a placement holds."""
    n = 0
    for _, gpus in slots:  # a loop, not sum(genexpr): twice as fast on one or two nodes
        n += len(gpus)
    return n


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JobTransitionV1(_Body):
    """The scheduler moved a job between lifecycle states (the audit record), with its cause
    as text only (`loom.job.transition.v1`, read but no longer written)."""

    job_id: JobId
    state: JobState
    previous: JobState | None
    cause: str
    gpus: int = 0
    placement: GpuSlots = ()
    iterations_done: float = 0.0
    status: Status | None = None
    spec: JobSpec | None = None  # on the first transition, so consumers know the job

    def why(self) -> Cause:
        """The transition's cause as a typed value."""
        return Cause.from_v1(self.cause, self.state)


class JobTransition(JobTransitionV1):
    """Version 2: the cause also as a typed value (`reason`, whose text is `cause`)."""

    reason: Cause

    @model_validator(mode="after")
    def _text_agrees(self) -> JobTransition:
        if self.reason.text != self.cause:
            raise ValueError(f"reason.text {self.reason.text!r} differs from cause "
                             f"{self.cause!r}")
        return self

    def why(self) -> Cause:
        return self.reason

    def as_v1(self) -> JobTransitionV1:
        """The same transition as version 1 (what a v1 log recorded)."""
        return JobTransitionV1(**{k: getattr(self, k) for k in JobTransitionV1.model_fields})


class CycleStarted(_Body):
    """A scheduling cycle begins: node agents close their accounting and report progress."""

    cycle: int = Field(ge=0)
    trigger: str


class StartForecast(_Body):
    """When the scheduler expects waiting jobs to start (`loom.sched.forecast`): its own
    cycles played forward from `at` with no new arrivals (services.scheduler.forecast).
    Job id → expected start (cluster time), or None: not within the forecast's horizon. A
    forecast of many jobs comes in `parts` messages, `part` 0, 1, ... An observation, not a
    decision: the decision digest and replay leave it out."""

    at: float
    cycle: int = Field(ge=0)
    starts: dict[str, float | None] = Field(default_factory=dict)
    part: int = Field(default=0, ge=0)
    parts: int = Field(default=1, ge=1)


class NodeStatus(_Body):
    """Progress of the jobs a node leads: job id → iterations done."""

    node_id: str
    cycle: int
    progress: dict[str, float] = Field(default_factory=dict)


class Launch(_Body):
    job_id: JobId
    spec: JobSpec
    placement: GpuSlots
    iterations_done: float = 0.0
    # Jobs that share these GPUs with it (interleaved, Muri), including itself; () when alone.
    colocated: tuple[str, ...] = ()
    # The scheduler lets a goodput-profiled job choose its batch size (Pollux co-adaptation).
    adaptive_batch: bool = False


# Reasons of the out-of-cycle stops (NodeCommand cycle -1). Only the first says the job is
# done: a node agent then never starts it again. A gang whose leader's run failed may run
# again (a retry), and a reconcile stop ends one stale run.
STOP_GANG_FINISHED = "finished"
STOP_GANG_FAILED = "failed: its leader's run failed"
STOP_RECONCILE = "reconcile: not placed here"


class Stop(_Body):
    job_id: JobId
    reason: str


class PlanDecided(_Body):
    """The outcome of one scheduling cycle, as a change to what runs where."""

    cycle: int
    launches: tuple[Launch, ...] = ()
    stops: tuple[Stop, ...] = ()
    running: int = 0
    busy_gpus: int = 0
    # The leader's election term (0 without election): the placer refuses older terms.
    term: int = Field(default=0, ge=0)


class NodeCommand(_Body):
    """What one node agent must change: start these jobs, stop those."""

    node_id: str
    cycle: int
    launches: tuple[Launch, ...] = ()
    stops: tuple[Stop, ...] = ()
    term: int = Field(default=0, ge=0)  # the plan's term: node agents drop older ones


class JobFinished(_Body):
    """A job's run ended on its leader node: completed, or (with `failure`) its trainer failed
    on its own; either way its GPUs are free again."""

    job_id: JobId
    node_id: str
    iterations_done: float
    failure: str | None = None  # why the trainer failed (it exited non-zero, not stopped)
    # The launch can never work (e.g. no trainer for its model): fail the job, no retries.
    permanent: bool = False


class OperatorCommand(_Body):
    """An operator's change to a running cluster (`loom cancel|suspend|resume|drain|...`)."""

    command: Literal["cancel", "suspend", "resume", "drain", "undrain", "set-policy"]
    job_id: JobId | None = None  # cancel, suspend, resume
    node_id: str | None = None  # drain, undrain
    policy: str | None = None  # set-policy
    requested_by: str = "operator"

    @model_validator(mode="after")
    def _target(self) -> OperatorCommand:
        need = {"cancel": "job_id", "suspend": "job_id", "resume": "job_id",
                "drain": "node_id", "undrain": "node_id", "set-policy": "policy"}[self.command]
        if getattr(self, need) is None:
            raise ValueError(f"{self.command} needs {need}")
        return self


class GpuInfo(_Body):
    """One GPU of a node as its agent found it (NVML/DCGM, or the fake backend)."""

    index: int = Field(ge=0)
    uuid: str
    name: str
    memory_bytes: int = Field(ge=0)


class GpuLink(_Body):
    a: str  # GPU UUIDs
    b: str
    kind: str  # nvlink | pcie-switch | pcie-host | system


class NodeInfo(_Body):
    """What a node agent found at start: its GPUs and how they are connected."""

    node_id: str
    backend: str  # dcgm | nvml | fake
    gpus: tuple[GpuInfo, ...]
    links: tuple[GpuLink, ...] = ()
    address: str = "127.0.0.1"  # where other nodes reach its trainers (rank 0's rendezvous)


class GpuSample(_Body):
    uuid: str
    utilization_ratio: float = Field(ge=0, le=1)
    memory_used_bytes: int = Field(ge=0)


# A doctor's checks are a few per node plus a few per GPU; this bounds a report of a
# 32-GPU node with every check failing, and a forged report's size.
MAX_HEALTH_PROBLEMS = 256


class HealthProblem(_Body):
    """One check a node agent's doctor did not pass (`loom doctor`; docs/doctor.md)."""

    check: str = Field(min_length=1, max_length=64)  # e.g. "ecc", "checkpoint", "xid"
    status: Literal["warn", "fail"]
    detail: str = Field(default="", max_length=1024)  # what it measured, and the fix
    gpu: int | None = Field(default=None, ge=0, le=4095)  # the GPU's index; None: the node's


class NodeHealth(_Body):
    """What a node agent's health checks found, problems only (none: healthy). A failed
    check about one GPU takes that GPU out of service; any other failed check cordons the
    node; warnings are shown and change nothing (`domain.health.verdict`)."""

    problems: tuple[HealthProblem, ...] = Field(default=(), max_length=MAX_HEALTH_PROBLEMS)


class NodeHeartbeat(_Body):
    """A node agent is alive: its GPUs' telemetry, the jobs it runs and its health."""

    node_id: str
    gpus: tuple[GpuSample, ...] = ()
    jobs: tuple[str, ...] = ()  # what it runs (or is about to rerun): the scheduler reconciles
    interval_s: float = Field(default=0.0, ge=0)  # until the next one; 0: not announced
    # (term, cycle) of the newest plan command it has carried out: a job launched by that
    # plan or an older one, placed here and not in `jobs`, has lost its run. None: unknown.
    handled: tuple[int, int] | None = None
    # Its latest health checks (start-up's and this beat's), as one report: the scheduler
    # cordons on it and lifts the cordon when a later beat no longer fails. Optional and
    # additive: a heartbeat without it (an agent that runs no checks) reads as before.
    health: NodeHealth | None = None


class TrainerReport(_Body):
    """What a job's rank 0 reported on a live cluster: start (or resume), progress, the end."""

    job_id: JobId
    node_id: str
    event: str  # started | progress | stopped | finished | failed
    iteration: int = Field(ge=0)
    loss: float | None = None
    resumed: bool = False  # started from a checkpoint
    throughput: float | None = None  # iterations per second over the last window


# A dead letter keeps this much of what was refused: the whole message stays in the event
# stream at the sequence the dead letter's id names, so the copy is only for diagnosis, and
# a small one keeps refused input (a flood of 1 MB junk, say) from growing the dead letters.
DEAD_LETTER_KEEP = 4096  # bytes of the payload
DEAD_LETTER_REASON_KEEP = 1024  # characters of the reason (a parser's message can echo input)


class DeadLetter(_Body):
    """A message a service could not accept, kept with the reason (see `kept`)."""

    subject: str
    service: str
    reason: str
    payload: bytes

    @classmethod
    def kept(cls, *, subject: str, service: str, reason: str, payload: bytes) -> DeadLetter:
        """The dead letter every bus and shell publishes, and replay expects: the payload and
        reason cut to DEAD_LETTER_KEEP bytes and DEAD_LETTER_REASON_KEEP characters. One
        place, so a replayed core's dead letter is the live shell's byte for byte. Cutting
        is idempotent: `kept` of a kept dead letter's fields is the same dead letter."""
        return cls(subject=subject, service=service, reason=reason[:DEAD_LETTER_REASON_KEEP],
                   payload=payload[:DEAD_LETTER_KEEP])

    def cut(self) -> DeadLetter:
        """This dead letter as `kept` would have built it (one recorded before the cut
        existed kept more)."""
        return DeadLetter.kept(subject=self.subject, service=self.service, reason=self.reason,
                               payload=self.payload)


EVENT_TYPES: dict[str, type[BaseModel]] = {
    "loom.job.submit.v1": SubmitJob,
    "loom.job.transition.v1": JobTransitionV1,
    "loom.job.transition.v2": JobTransition,
    "loom.cycle.started.v1": CycleStarted,
    "loom.forecast.start.v1": StartForecast,
    "loom.queue.status.v1": QueueStatus,  # an observation, as forecasts are
    "loom.node.status.v1": NodeStatus,
    "loom.plan.decided.v1": PlanDecided,
    "loom.node.command.v1": NodeCommand,
    "loom.job.finished.v1": JobFinished,
    "loom.job.progress.v1": TrainerReport,
    "loom.node.info.v1": NodeInfo,
    "loom.ops.command.v1": OperatorCommand,
    "loom.node.heartbeat.v1": NodeHeartbeat,
    "loom.deadletter.v1": DeadLetter,
}
TYPE_OF: dict[type[BaseModel], str] = {v: k for k, v in EVENT_TYPES.items()}
_new_envelope = tuple.__new__  # an Envelope from its fields in order, without NamedTuple's call


class Envelope(NamedTuple):
    """Metadata every message carries; `event_id` doubles as the JetStream `Nats-Msg-Id`.

    A NamedTuple: immutable, and built in the hot path as one tuple (a frozen dataclass sets
    each field through `object.__setattr__`). Decoding from the wire validates it (and its
    typed body) through `validate_envelope`; `_replace` makes a changed copy.
    """

    type: str
    event_id: str
    causation_id: str | None
    occurred_at: float
    producer: str
    body: BaseModel

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "event_id": self.event_id,
            "causation_id": self.causation_id,
            "occurred_at": self.occurred_at,
            "producer": self.producer,
            "body": self.body.model_dump(mode="python"),
        }


class _EnvelopeIn(BaseModel):
    """Wire-side check of the envelope fields; the body is checked by its own model."""

    model_config = ConfigDict(extra="forbid")

    type: str
    event_id: str = Field(min_length=1, max_length=256)
    causation_id: str | None = Field(default=None, max_length=256)
    occurred_at: float
    producer: str = Field(min_length=1, max_length=128)
    body: dict[str, Any]


def validate_envelope(data: Any) -> Envelope:
    """Build an Envelope from decoded wire data; raises ValueError/ValidationError."""
    raw = _EnvelopeIn.model_validate(data)
    model = EVENT_TYPES.get(raw.type)
    if model is None:
        raise ValueError(f"unknown event type {raw.type!r}")
    body = model.model_validate(raw.body)
    return Envelope(raw.type, raw.event_id, raw.causation_id, raw.occurred_at, raw.producer, body)


def envelope(
    body: BaseModel, *, event_id: str, occurred_at: float, producer: str, causation_id: str | None
) -> Envelope:
    return _new_envelope(Envelope, (TYPE_OF[type(body)], event_id, causation_id, occurred_at,
                                    producer, body))
