"""Replay: feed a log's recorded inputs to fresh cores and check every recorded decision.

Each replayed core (scheduler, placer) runs alone in virtual time. Records on the subjects it
subscribes to are delivered to it in log order (the bus delivers in publish order), at their
recorded time; the timers it sets fire in (time, priority, order set) as the kernel fires them.
Whenever the log shows a message the core published, the next decision the fresh core produced
must be that message: same subject, type, body, cause and time.

Timers and inputs at the same instant interleave as in the kernel: a cycle (PRIORITY_CYCLE)
runs after the inputs of its instant, unless the log shows its decision first; an input-priority
timer (a policy wake-up) due at an input's instant fires first if it was set before that input
was recorded. A timer that fires without publishing leaves no trace in the log, so this is the
one place replay reconstructs rather than reads the order.

Start forecasts (`loom.sched.forecast`) and the queues' status (`loom.sched.queues`) are not
decisions: they change nothing, and replay skips them, so a log recorded with them on replays
with them off.

Sim logs are compared exactly. Live logs are compared structurally (floats, i.e. times and
progress estimates, are left out, and so is a dead letter's payload: `_structure`): a live core
read the wall clock when a message arrived, which the log does not hold, so an input is fed at
the time of the core's first reply to it. A dead letter is compared as `DeadLetter.kept` cuts
it, also where the log recorded it whole (before dead letters were cut).
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from loom.eventlog import EventLog, EventLogError, Record
from schemas import subjects
from schemas.codec import decode, encode
from schemas.events import (
    TYPE_OF,
    DeadLetter,
    Envelope,
    JobTransition,
    JobTransitionV1,
    PlanDecided,
    StartForecast,
)
from schemas.queue_status import QueueStatus
from services.metrics.core import plan_record, transition_record
from services.runtime.bus import decode_any, fallback_id
from services.runtime.effects import (
    PRIORITY_INPUT,
    CancelTimer,
    Effect,
    Publish,
    ReserveOrder,
    SetTimer,
    SetTimers,
)
from services.runtime.service import Core

# What the scheduler publishes that no core consumes and none must make: skipped.
OBSERVATIONS: tuple[type[BaseModel], ...] = (StartForecast, QueueStatus)


@dataclass(frozen=True, slots=True)
class Decision:
    """A message a fresh core published on replay."""

    subject: str
    body: BaseModel
    causation_id: str | None
    at: float

    @property
    def type(self) -> str:
        return TYPE_OF[type(self.body)]


@dataclass(frozen=True, slots=True)
class Input:
    record: Record
    env: Envelope | None  # None: a timer fired
    timer: Hashable = None
    at: float = 0.0  # when the timer fired

    def describe(self) -> str:
        if self.env is None:
            return f"t={self.at!r} timer {self.timer!r} fired"
        return (f"#{self.record.index} seq {self.record.seq} t={self.record.time!r} "
                f"{self.record.subject} {self.env.type} {_short(self.env.body)}")


@dataclass(frozen=True)
class Divergence:
    core: str
    record: Record | None  # the recorded decision (None: the log ended)
    recorded: Envelope | None
    replayed: Decision | None
    inputs: tuple[Input, ...]  # what the core received since its previous matching decision
    matched: int  # decisions that matched before this one
    why: str

    def render(self) -> str:
        where = ("at the end of the log" if self.record is None
                 else f"at record {self.record.index} (seq {self.record.seq}, "
                      f"t={self.record.time!r})")
        lines = [f"DIVERGED: {self.core} decision {self.matched + 1} {where}: {self.why}",
                 f"  recorded: {_describe_env(self.recorded)}",
                 f"  replayed: {_describe_decision(self.replayed)}",
                 f"  inputs since the previous decision ({len(self.inputs)}):"]
        lines += [f"    {i.describe()}" for i in self.inputs[-20:]]
        if len(self.inputs) > 20:
            lines.insert(-20, f"    … {len(self.inputs) - 20} earlier inputs left out")
        return "\n".join(lines)


@dataclass
class ReplayResult:
    decisions: dict[str, int]  # core → decisions checked
    inputs: dict[str, int]  # core → inputs fed
    digest: str  # decision_digest of the scheduler's decisions, as the metrics service computes
    divergence: Divergence | None = None
    undecodable: int = 0  # inputs no decoder accepted (dead-lettered in the run too)
    # core → decisions it made after a live log's last record: the log was cut before they
    # were stored (see `replay`)
    cut_off: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _dump(body: BaseModel) -> dict[str, Any]:
    """A body's fields as JSON values; bytes that are not UTF-8 (a dead letter's payload)
    stay Python bytes."""
    try:
        return body.model_dump(mode="json")
    except UnicodeDecodeError:
        return body.model_dump(mode="python")


def _short(body: BaseModel, limit: int = 400) -> str:
    text = repr(_dump(body))
    return text if len(text) <= limit else text[:limit] + "…"


def _describe_env(env: Envelope | None) -> str:
    if env is None:
        return "nothing"
    return (f"{env.type} at t={env.occurred_at!r}, caused by {env.causation_id}: "
            f"{_short(env.body)}")


def _describe_decision(d: Decision | None) -> str:
    if d is None:
        return "nothing"
    return f"{d.type} at t={d.at!r}, caused by {d.causation_id}: {_short(d.body)}"


def _structure(body: BaseModel) -> Any:
    """What a live log's decision is compared by. Not its floats: a live core read the wall
    clock, which the log does not hold. Nor a dead letter's payload: that is the refused
    input as the shell re-encoded it, stamped with the time it was decoded (a person's JSON
    submission has no time of its own); the record its `causation_id` names is the input."""
    data = body.model_dump(mode="python")
    if isinstance(body, DeadLetter):
        data["payload"] = None
    return _without_floats(data)


def _without_floats(value: Any) -> Any:
    if isinstance(value, float):
        return None
    if isinstance(value, dict):
        return {k: _without_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_floats(v) for v in value]
    return value


@dataclass(order=True)
class _Timer:
    at: float
    priority: int
    order: int
    key: Hashable = field(compare=False)
    set_at_index: int = field(compare=False)
    live: bool = field(default=True, compare=False)


class CoreReplay:
    """One fresh core, fed in virtual time; collects what it publishes."""

    def __init__(self, core: Core, *, exact: bool) -> None:
        self.core = core
        self.name = core.name
        self.exact = exact
        self.subs = list(core.subscriptions())
        self.pending: deque[Decision] = deque()
        self.inputs: list[Input] = []
        self.matched = 0
        self.fed = 0
        self.undecodable = 0  # inputs the bus dead-lettered in the run, skipped likewise
        self._heap: list[_Timer] = []
        self._timers: dict[Hashable, _Timer] = {}
        self._order = 0  # timers set (their order at one instant), with places reserved
        self._reserved = 0  # the place before the block last reserved (`ReserveOrder`)

    def accepts(self, subject: str) -> bool:
        return any(subjects.matches(s.subject, subject) for s in self.subs)

    def start(self, at: float) -> None:
        self._apply(self.core.start(at), None, at, 0)

    # -- timers ----------------------------------------------------------------------------
    def _next_timer(self) -> _Timer | None:
        while self._heap and not self._heap[0].live:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def _fire(self, timer: _Timer, record: Record, index: int) -> None:
        heapq.heappop(self._heap)
        del self._timers[timer.key]
        self.inputs.append(Input(record, None, timer.key, timer.at))
        try:
            effects = self.core.on_timer(timer.key, timer.at)
        except Exception:  # the shell logs a failed timer and goes on; so does replay
            return
        self._apply(effects, None, timer.at, index)

    def fire_before_input(self, record: Record) -> None:
        """Fire what the kernel would have fired before delivering `record`."""
        while (t := self._next_timer()) is not None and (
                t.at < record.time or (t.at == record.time and t.priority <= PRIORITY_INPUT
                                       and t.set_at_index < record.index)):
            self._fire(t, record, record.index)

    def fire_for_decision(self, record: Record) -> None:
        """The log shows a decision of this core: fire due timers until one publishes."""
        while not self.pending and (t := self._next_timer()) is not None and \
                t.at <= record.time:
            self._fire(t, record, record.index)

    def fire_rest(self, record: Record, until: float) -> None:
        while (t := self._next_timer()) is not None and t.at <= until:
            self._fire(t, record, record.index + 1)

    # -- messages --------------------------------------------------------------------------
    def deliver(self, record: Record, decoded: Envelope | None,
                handled_at: dict[str, float]) -> None:
        """The bus decodes with the subscriber's decoder (`decoded`: the plain decoder's
        result, reused); an undecodable payload is dead-lettered by the bus and never reaches
        the core. `handled_at`: when the core handled an input, where the log tells (live)."""
        sub = next(s for s in self.subs if subjects.matches(s.subject, record.subject))
        if sub.decoder is decode_any and decoded is not None:
            env = decoded
        else:
            try:
                env = sub.decoder(record.data, now=record.time,
                                  fallback_id=fallback_id(record.msg_id, record.seq))
            except Exception:
                self.undecodable += 1
                return
        at = handled_at.get(env.event_id, record.time)
        if at != record.time:
            record = dataclasses.replace(record, time=at)
        self.fire_before_input(record)
        self.fed += 1
        self.inputs.append(Input(record, env))
        try:
            effects = self.core.handle(env, at)
        except Exception as exc:  # the shell dead-letters it with the reason
            body = DeadLetter.kept(subject=env.type, service=self.name,
                                   reason=f"{type(exc).__name__}: {exc}", payload=encode(env))
            effects = [Publish(subjects.deadletter(self.name), body)]
        self._apply(effects, env.event_id, at, record.index)

    def _apply(self, effects: Iterable[Effect], cause: str | None, at: float,
               index: int) -> None:
        for eff in effects:
            if isinstance(eff, Publish):
                self.pending.append(Decision(eff.subject, eff.body, cause, at))
            elif isinstance(eff, SetTimers):  # many re-arms in one effect: set in order
                self._apply([SetTimer(key, when, eff.priority) for key, when in eff.timers],
                            cause, at, index)
            elif isinstance(eff, ReserveOrder):
                self._reserved = self._order
                self._order += eff.count
            elif isinstance(eff, SetTimer):
                old = self._timers.pop(eff.key, None)
                if old is not None:
                    old.live = False
                if eff.order is None:
                    self._order += 1
                    order = self._order
                else:
                    order = self._reserved + 1 + eff.order
                timer = _Timer(max(eff.at, at), eff.priority, order, eff.key, index)
                self._timers[eff.key] = timer
                heapq.heappush(self._heap, timer)
            elif isinstance(eff, CancelTimer):
                old = self._timers.pop(eff.key, None)
                if old is not None:
                    old.live = False
            else:
                raise TypeError(f"{self.name}: replay cannot carry out {eff!r}")

    # -- checking --------------------------------------------------------------------------
    def differs(self, record: Record, env: Envelope, got: Decision) -> str | None:
        if isinstance(env.body, DeadLetter):  # recorded before dead letters were cut: cut it
            env = env._replace(body=env.body.cut())
        if type(env.body) is JobTransitionV1 and isinstance(got.body, JobTransition):
            got = dataclasses.replace(got, body=got.body.as_v1())  # a log of version 1
        if got.subject != record.subject:
            return f"subject {record.subject} recorded, {got.subject} replayed"
        if got.type != env.type:
            return f"type {env.type} recorded, {got.type} replayed"
        if got.causation_id != env.causation_id:
            return f"caused by {env.causation_id} recorded, by {got.causation_id} replayed"
        if self.exact:
            if got.at != env.occurred_at:
                return f"time {env.occurred_at!r} recorded, {got.at!r} replayed"
            if got.body != env.body:
                return f"body differs: {_field_diff(env.body, got.body)}"
        else:
            a, b = _structure(env.body), _structure(got.body)
            if a != b:
                return f"body differs: {_field_diff(env.body, got.body)}"
        return None


def _field_diff(recorded: BaseModel, replayed: BaseModel) -> str:
    a, b = _dump(recorded), _dump(replayed)
    keys = [k for k in a if a.get(k) != b.get(k)]
    return ", ".join(f"{k}: {a.get(k)!r:.120} recorded, {b.get(k)!r:.120} replayed"
                     for k in keys[:4]) or "(equal after dump)"


class _Digest:
    """The metrics service's decision digest over the scheduler's decisions, in log order."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, env: Envelope) -> None:
        if isinstance(env.body, JobTransitionV1):  # either version
            self._h.update(transition_record(env.body, env.occurred_at).encode())
        elif isinstance(env.body, PlanDecided):
            self._h.update(plan_record(env.body, env.occurred_at).encode())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def recorded_envelope(record: Record) -> Envelope | None:
    """The envelope a record carries, or None for a raw payload (e.g. JSON submissions)."""
    try:
        return decode(record.data)
    except Exception:
        return None


def check_payloads(log: EventLog) -> None:
    """Refuse a version-1 sim log whose payload does not decode. Such a log has no checksums,
    but `loom sim` records only envelopes Loom encoded, so a payload that is not one was
    damaged after the run; replaying it would report a divergence that is not one. (A
    version-2 log's checksums already vouch for its payloads: one that does not decode was
    recorded so, and is skipped as the bus skipped it.)"""
    if log.version >= 2 or log.source != "sim":
        return
    for rec in log.records:
        try:
            decode(rec.data)
        except Exception as exc:
            raise EventLogError(log.path, rec.index, f"payload does not decode ({exc}); a "
                                "simulation records only envelopes, so the file was damaged "
                                "(version-1 logs carry no checksums)") from None


def _handling_times(log: EventLog, handled: dict[str, dict[str, float]]) -> None:
    """A live core read its clock when an input reached it, which the log does not hold; the
    time of the first message it published in reply is the closest the log comes."""
    for rec in log.records:
        env = recorded_envelope(rec)
        if env is not None and env.causation_id is not None and env.producer in handled:
            handled[env.producer].setdefault(env.causation_id, env.occurred_at)


# Replay progress: (messages replayed, messages in the log, the log's time at that message).
ReplayProgress = Callable[[int, int, float], None]
PROGRESS_EVERY = 2048  # messages between two progress reports


def replay(log: EventLog, cores: list[Core], progress: ReplayProgress | None = None
           ) -> ReplayResult:
    """Check every decision the log holds of `cores` against fresh copies fed its inputs;
    `progress` is told how far it is every `PROGRESS_EVERY` messages."""
    exact = log.source == "sim"
    replays = [CoreReplay(core, exact=exact) for core in cores]
    first = log.records[0].time if log.records else 0.0
    start_at = 0.0 if exact else first
    for r in replays:
        r.start(start_at)
    digest = _Digest()
    by_name = {r.name: r for r in replays}
    handled: dict[str, dict[str, float]] = {r.name: {} for r in replays}
    if not exact:
        _handling_times(log, handled)
    divergence: Divergence | None = None

    def diverge(r: CoreReplay, rec: Record | None, env: Envelope | None,
                got: Decision | None, why: str) -> Divergence:
        return Divergence(r.name, rec, env, got, tuple(r.inputs), r.matched, why)

    total = len(log.records)
    for done, rec in enumerate(log.records):
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done, total, rec.time)
        env = recorded_envelope(rec)
        if env is not None and rec.subject in subjects.LEGACY_NODE_SUBJECTS:
            node = getattr(env.body, "node_id", None)
            rec = dataclasses.replace(rec, subject=subjects.current_subject(rec.subject, node))
        if env is not None and type(env.body) in OBSERVATIONS:
            continue  # an observation, not a decision: no core consumes it, none must make it
        producer = by_name.get(env.producer) if env is not None else None
        if env is not None and producer is not None:
            producer.fire_for_decision(rec)
            if not producer.pending:
                divergence = diverge(producer, rec, env, None,
                                     "the log has a decision the fresh core did not make")
                break
            got = producer.pending[0]
            why = producer.differs(rec, env, got)
            if why is not None:
                divergence = diverge(producer, rec, env, got, why)
                break
            producer.pending.popleft()
            producer.matched += 1
            producer.inputs.clear()
            if producer.name == "scheduler":
                digest.add(env)
        for r in replays:
            if r is not producer and r.accepts(rec.subject):
                r.deliver(rec, env, handled[r.name])
    cut_off: dict[str, int] = {}
    if divergence is None and log.records:
        last = log.records[-1]
        for r in replays:
            r.fire_rest(last, last.time)
            if r.pending and exact:
                divergence = diverge(r, None, None, r.pending[0],
                                     "the fresh core made a decision the log does not have")
                break
            # A live log ends wherever its export or the stack's shutdown cut the stream: a
            # reply to its last inputs may never have been stored. Any decision the log does
            # hold was checked above, so only these trailing ones go unchecked.
            if r.pending:
                cut_off[r.name] = len(r.pending)
    return ReplayResult(decisions={r.name: r.matched for r in replays},
                        inputs={r.name: r.fed for r in replays},
                        digest=digest.hexdigest(), divergence=divergence,
                        undecodable=sum(r.undecodable for r in replays), cut_off=cut_off)


def check_digest(log: EventLog, result: ReplayResult) -> None:
    """A complete sim log's trailer holds the run's digest; the records must reproduce it."""
    if result.ok and log.decision_digest is not None and log.decision_digest != result.digest:
        raise EventLogError(log.path, None, f"the recorded decisions hash to {result.digest}, "
                                            f"the trailer says {log.decision_digest}")
