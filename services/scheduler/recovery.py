"""Rebuilding a service's state from the event stream, after a crash or a leader failover.

The scheduler rebuilds from its own *recorded decisions*, not by re-running its inputs. On a
live cluster the order in which a service saw its inputs and fired its timers is not in the
stream (each consumer is delivered on its own, cycles fire on the wall clock), so feeding the
recorded inputs to a fresh core can decide differently from what was published and carried
out: the rebuilt scheduler would believe in launches the placer never saw. The decisions
(`JobTransition`s with the job's spec, placement and progress; `PlanDecided` with each
launch's co-located group; cycle numbers) are what the rest of the cluster acted on, so they
are the state to restore. Inputs the dead scheduler had not acknowledged come back from the
durable consumers (`NatsLiveBus.rewind` restarts them at their acknowledgement floor), and
handling one twice changes nothing: a known job's submission is ignored, and so is a finish
of a job that no longer runs. A KV snapshot of the core was the other option; it would have
to serialise every policy's private state (solver caches included) on every message, and
its tail would still be the same unacknowledged inputs.

A simulated node agent (`SimNodeCore`) is deterministic in its inputs (its commands, with
the time they were sent), so it rebuilds by replaying them through its core with the effects
dropped, minus the jobs it has reported finished; its finish timers are then re-armed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas import subjects
from schemas.codec import decode
from schemas.events import (
    CycleStarted,
    Envelope,
    GpuSlots,
    JobFinished,
    JobTransition,
    NodeCommand,
    NodeInfo,
    OperatorCommand,
    PlanDecided,
)
from schemas.job import JobState
from services.nodeagent.simnode import SimNodeCore
from services.runtime.effects import Effect
from services.runtime.logging import get_logger
from services.scheduler.core import JobRecord, SchedulerCore
from services.scheduler.lifecycle import Transition

log = get_logger("loom.recovery")

# What the scheduler rebuilds from: its decisions, plus the inputs that configure it.
SCHEDULER_HISTORY = (subjects.JOB_TRANSITION, subjects.PLAN_DECIDED, subjects.CYCLE_STARTED,
                     subjects.NODE_INFO, subjects.OPERATOR)


@dataclass(frozen=True, slots=True)
class _Launched:
    seq: int
    at: float
    group: tuple[str, ...]
    placement: GpuSlots


@dataclass(frozen=True, slots=True)
class Recorded:
    """One message of the stream, with its stream sequence number."""

    seq: int
    subject: str
    env: Envelope


async def read_stream(js: Any, subject_filters: Sequence[str], *, stream: str = subjects.STREAM,
                      prefix: str = "", batch: int = 500) -> list[Recorded]:
    """Every decodable message on the given subjects, in stream order (undecodable ones were
    dead-lettered when they arrived and are skipped)."""
    out: list[Recorded] = []
    for subject in subject_filters:
        psub = await js.pull_subscribe(
            prefix + subject, stream=stream,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                                  inactive_threshold=30.0))
        try:
            pending = (await psub.consumer_info()).num_pending  # no waiting on an empty one
            misses = 0
            while pending > 0:
                try:
                    msgs = await psub.fetch(min(batch, pending), timeout=5.0)
                except nats.errors.TimeoutError:
                    misses += 1  # a busy server: a short history would lose jobs, so retry
                    if misses == 5:
                        raise RuntimeError(f"{subject}: {pending} messages of the stream "
                                           "did not arrive; not rebuilding from part of it"
                                           ) from None
                    continue
                pending -= len(msgs)
                for msg in msgs:
                    try:
                        env = decode(msg.data)
                    except Exception:  # dead-lettered when it was delivered
                        continue
                    out.append(Recorded(msg.metadata.sequence.stream,
                                        msg.subject[len(prefix):], env))
                if msgs and msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            await psub.unsubscribe()
    out.sort(key=lambda r: r.seq)
    return out


def rebuild_scheduler(core: SchedulerCore, history: Sequence[Recorded], now: float
                      ) -> list[Effect]:
    """Restore a fresh core's job table from its recorded decisions (see module docstring);
    returns what to publish and arm on going live: repairs for a plan whose transitions were
    not stored before the crash, and a cycle."""
    last_transition: dict[str, int] = {}
    launches: dict[str, _Launched] = {}
    stops: dict[str, int] = {}
    policy: str | None = None
    for rec in history:
        body, at = rec.env.body, rec.env.occurred_at
        if isinstance(body, JobTransition):
            if _apply_transition(core, body, at):
                last_transition[body.job_id] = rec.seq
        elif isinstance(body, PlanDecided):
            core.cycle = max(core.cycle, body.cycle)
            for launch in body.launches:
                launches[launch.job_id] = _Launched(rec.seq, at, launch.colocated,
                                                    launch.placement)
            for stop in body.stops:
                stops[stop.job_id] = rec.seq
        elif isinstance(body, CycleStarted):
            core.cycle = max(core.cycle, body.cycle)
        elif isinstance(body, NodeInfo):
            core.handle(rec.env, at)  # learns the node's NVLink pairs; publishes nothing
        elif isinstance(body, OperatorCommand):
            policy = _apply_operator(core, body) or policy
    if policy is not None and policy != core.policy.name:
        core.switch_policy(policy)
    effects = _repair(core, last_transition, launches, stops, now)
    launched = {jid: (x.at, x.group) for jid, x in launches.items()}
    for jid, job in core.jobs.items():  # launched at its last RUNNING transition
        if job.state is JobState.RUNNING and job.history:
            launched[jid] = (job.history[-1].at, launched.get(jid, (0.0, ()))[1])
    effects += core.adopt(launched, now)
    log.info("scheduler rebuilt", jobs=len(core.jobs), cycle=core.cycle,
             running=sum(r.state is JobState.RUNNING for r in core.jobs.values()),
             repaired=len(effects) - 1)
    return effects


def _apply_transition(core: SchedulerCore, t: JobTransition, at: float) -> bool:
    rec = core.jobs.get(t.job_id)
    if rec is None:
        if t.spec is None:
            return False  # rejected before it had a valid spec: nothing to restore
        rec = core.jobs[t.job_id] = JobRecord(spec=t.spec, admitted=len(core.jobs),
                                              accounted_at=at)
    if rec.state is JobState.RUNNING:
        rec.attained_s += at - rec.accounted_at
    rec.accounted_at = at
    rec.history.append(Transition(at, rec.state, t.state, t.cause))
    rec.state = t.state
    rec.iterations_done = t.iterations_done
    if t.state is JobState.RUNNING:
        rec.place(t.placement)
    elif t.state in (JobState.PREEMPTED, JobState.FAILED):  # a finished job keeps its GPUs'
        rec.placement = ()  # record, as the live core does
    if t.state is JobState.RUNNING:
        if rec.started_at is None:
            rec.started_at = at
        core.held.discard(t.job_id)
    elif t.state is JobState.PREEMPTED:
        rec.preemptions += 1
        if t.cause == "suspended":
            core.held.add(t.job_id)
    if t.state.terminal:
        rec.status, rec.ended_at = t.status, at
        core.held.discard(t.job_id)
    return True


def _apply_operator(core: SchedulerCore, cmd: OperatorCommand) -> str | None:
    """Operators' commands that leave no transition behind; returns a new policy's name."""
    if cmd.command == "drain" and cmd.node_id in core.topology.index:
        core.drained.add(cmd.node_id)
    elif cmd.command == "undrain" and cmd.node_id is not None:
        core.drained.discard(cmd.node_id)
    elif cmd.command == "resume" and cmd.job_id is not None:
        core.held.discard(cmd.job_id)
    elif cmd.command == "set-policy":
        return cmd.policy
    return None


def _repair(core: SchedulerCore, last_transition: dict[str, int],
            launches: dict[str, _Launched], stops: dict[str, int],
            now: float) -> list[Effect]:
    """A plan stored without its transitions (the crash fell between them): the placer has
    carried it out, so the job table follows the plan, and the missing transitions go out."""
    effects: list[Effect] = []
    for jid, rec in core.jobs.items():
        if rec.state is None or rec.state.terminal:
            continue
        seen = last_transition.get(jid, 0)
        launch = launches.get(jid)
        stop = stops.get(jid, 0)
        if launch is not None and launch.seq > seen and launch.seq > stop:
            if rec.state is not JobState.RUNNING:
                rec.place(launch.placement)
                effects.append(core.record(rec, JobState.RUNNING, "recovered", now))
        elif stop > seen and rec.state is JobState.RUNNING:
            rec.preemptions += 1
            rec.placement = ()
            effects.append(core.record(rec, JobState.PREEMPTED, "recovered", now))
    return effects


def rebuild_sim_node(core: SimNodeCore, history: Sequence[Recorded], now: float
                     ) -> list[Effect]:
    """Replay a simulated node's commands (effects dropped: they were carried out), forget
    the jobs it reported finished, and re-arm the finish timers of the rest."""
    node = core.node.node_id
    wanted = [s.subject for s in core.subscriptions()]
    for rec in history:
        body = rec.env.body
        if isinstance(body, JobFinished):
            if body.node_id == node:
                core.jobs.pop(body.job_id, None)
                core.gate.finish(body.job_id)
        elif any(subjects.matches(w, rec.subject) for w in wanted):
            if isinstance(body, NodeCommand) and body.node_id != node:
                continue
            core.handle(rec.env, rec.env.occurred_at)
    effects: list[Effect] = []
    for run in core.jobs.values():
        if run.leader:
            run.advance(now, interrupted=False)
            effects.append(run.finish_timer(now))
    log.info("node agent rebuilt", node=node, jobs=len(core.jobs))
    return effects


def history_subjects(core: Any) -> tuple[str, ...]:
    """What a core rebuilds from (empty: it does not rebuild)."""
    if isinstance(core, SchedulerCore):
        return SCHEDULER_HISTORY
    if isinstance(core, SimNodeCore):
        node = core.node.node_id
        return (subjects.node_command(node), subjects.node_subject(node, subjects.FINISHED),
                *([subjects.CYCLE_STARTED] if core.overhead.charges_per_event else []))
    return ()


def rebuild(core: Any, history: Sequence[Recorded], now: float) -> list[Effect]:
    if isinstance(core, SchedulerCore):
        return rebuild_scheduler(core, history, now)
    if isinstance(core, SimNodeCore):
        return rebuild_sim_node(core, history, now)
    return []


async def recover(core: Any, bus: Any, now: float) -> list[Effect]:
    """Rebuild `core` from `bus`'s stream before it goes live, and make the bus's durable
    consumers restart at their acknowledgement floor; returns the effects to apply once the
    shell has started. Cores that do not rebuild are left alone."""
    wanted = history_subjects(core)
    if not wanted:
        return []
    bus.rewind = True
    history = await read_stream(bus.js, wanted, stream=bus.stream, prefix=bus.prefix)
    return rebuild(core, history, now)
