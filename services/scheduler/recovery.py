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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from domain import causes
from schemas import subjects
from schemas.events import (
    CycleStarted,
    GpuSlots,
    JobTransitionV1,
    NodeInfo,
    OperatorCommand,
    PlanDecided,
)
from schemas.job import JobState
from services.runtime.effects import Effect
from services.runtime.logging import get_logger
from services.runtime.service import Recorded
from services.scheduler import operators

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore

log = get_logger("loom.recovery")

# What the scheduler rebuilds from: its decisions, plus the inputs that configure it.
HISTORY = (subjects.JOB_TRANSITION, subjects.PLAN_DECIDED, subjects.CYCLE_STARTED,
           subjects.NODE_INFO, subjects.OPERATOR)


@dataclass(frozen=True, slots=True)
class _Launched:
    seq: int
    at: float
    group: tuple[str, ...]
    placement: GpuSlots


def rebuild(core: SchedulerCore, history: Sequence[Recorded], now: float) -> list[Effect]:
    """Restore a fresh core's job table from its recorded decisions (see module docstring);
    returns what to publish and arm on going live: repairs for a plan whose transitions were
    not stored before the crash, and a cycle."""
    last_transition: dict[str, int] = {}
    runs = _Runs()
    launches: dict[str, _Launched] = {}
    stops: dict[str, int] = {}
    policy: str | None = None
    for rec in history:
        body, at = rec.env.body, rec.env.occurred_at
        if isinstance(body, JobTransitionV1):  # either version
            if core.jobs.restore(body, at):
                last_transition[body.job_id] = rec.seq
                runs.add(body, core.jobs[body.job_id].spec.tenant, at)
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
    if core.admission is not None and core.admission.queues is not None:
        core.admission.queues.restore(runs.until(now), now)  # the queues' fair share
    effects = _repair(core, last_transition, launches, stops, now)
    launched = {jid: (x.at, x.group) for jid, x in launches.items()}
    for jid, job in core.jobs.items():  # launched at its last RUNNING transition
        if job.state is JobState.RUNNING and job.last is not None:
            launched[jid] = (job.last.at, launched.get(jid, (0.0, ()))[1])
    effects += core.adopt(launched, now)
    log.info("scheduler rebuilt", jobs=len(core.jobs), cycle=core.cycle,
             running=sum(r.state is JobState.RUNNING for r in core.jobs.values()),
             repaired=len(effects) - 1)
    return effects


class _Runs:
    """Each job's runs on its GPUs, from its transitions: (tenant, GPUs, from, to)."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, float, float, float]] = []
        self._open: dict[str, tuple[str, float, float]] = {}  # job → (tenant, GPUs, since)

    def add(self, t: JobTransitionV1, tenant: str, at: float) -> None:
        began = self._open.pop(t.job_id, None)
        if began is not None:  # it leaves its GPUs (a migration takes new ones)
            self.ended.append((*began, at))
        if t.state is JobState.RUNNING:
            self._open[t.job_id] = (tenant, float(sum(len(g) for _, g in t.placement)), at)

    def until(self, now: float) -> list[tuple[str, float, float, float]]:
        """The ended runs, and the open ones up to `now`."""
        return self.ended + [(*began, now) for began in self._open.values()]


def _apply_operator(core: SchedulerCore, cmd: OperatorCommand) -> str | None:
    """Operators' commands that leave no transition behind; returns a new policy's name."""
    if (cmd.command in ("drain", "undrain") and cmd.node_id is not None
            and cmd.node_id in core.topology.index):
        operators.drain(core, cmd.command, cmd.node_id, cmd.requested_by)
    elif cmd.command == "resume" and cmd.job_id is not None:
        core.jobs.held.discard(cmd.job_id)
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
                effects.append(core.transition(rec, JobState.RUNNING, causes.RECOVERED, now))
        elif stop > seen and rec.state is JobState.RUNNING:
            rec.preemptions += 1
            rec.placement = ()
            effects.append(core.transition(rec, JobState.PREEMPTED, causes.RECOVERED, now))
    return effects
