"""A simulated node: advances its jobs from their iteration times under an overhead model.

Jobs that share GPUs (Muri's interleaving) each run at the group's interleaved iteration time
(`overhead.job_rates`).

Only the first node of a job's placement (its leader) accounts progress and reports the finish;
the other nodes of a gang just hold their GPUs. At each scheduling cycle the node closes every
running job's interval (charging the model's per-event cost) and re-arms the job's completion
timer: completion = now + remaining iterations × iteration time, as the Muri and Tiresias
simulators predict it. When it stops a job it reports the progress the job had reached.

It does so lazily, with the same arithmetic in the same order: a cycle is logged (and the
places its re-arms would take among same-instant work reserved), and a run is charged the
cycles logged since it was last charged when its timer comes up (a cycle only moves a finish
later), when it stops, or every `CATCH_UP_CYCLES` cycles (which bounds the log). A timer that
comes up early is set again where the last cycle would have put it (`SetTimer.order`), so
runs that finish at one instant finish in the order eager re-arms gave them.

A job that replays a trace's failures (`JobSpec.fail_at`) fails on cue: its timer is set to
the earlier of its next unreached failure mark and its end, and at a mark the node reports the
run failed there, a recorded failure (for good at a mark equal to its iterations).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from domain import causes
from domain.overhead import OverheadModel, job_rates, progress_segments
from domain.progress import CATCH_UP_CYCLES, RunProgress
from schemas import subjects
from schemas.cluster import NodeSpec
from schemas.events import (
    CycleStarted,
    Envelope,
    JobFinished,
    Launch,
    NodeCommand,
    NodeStatus,
    gpu_count,
)
from schemas.job import JobSpec
from schemas.throughputs import ThroughputTable
from services.nodeagent.gate import CommandGate
from services.runtime.bus import Interest
from services.runtime.effects import (
    PRIORITY_INPUT,
    CancelTimer,
    Effect,
    Publish,
    ReserveOrder,
    SetTimer,
    SetTimers,
)
from services.runtime.logging import get_logger
from services.runtime.service import CoreDefaults, Recorded, Subscribe

log = get_logger("loom.nodeagent")


@dataclass(slots=True)
class _Run:
    spec: JobSpec
    leader: bool
    progress: RunProgress
    fail_at: float | None = None  # the recorded failure mark this run ends at (None: none)
    synced: int = 0  # the node's cycles charged to it, counted from the node's first
    key: tuple[str, str] = field(init=False)  # its finish timer's, made once

    def __post_init__(self) -> None:
        self.key = ("finish", self.spec.job_id)

    @property
    def charged(self) -> bool:
        """Whether cycles cost it time (it leads its job, and the model charges events)."""
        return self.leader and bool(self.progress.per_event_s)

    def advance(self, now: float, interrupted: bool) -> None:
        self.progress.advance(now, self.progress.per_event_s if interrupted else 0.0)

    def finish_timer(self, now: float) -> SetTimer:
        return SetTimer(self.key, self.progress.finish_at(now, self.fail_at), PRIORITY_INPUT)

    def done(self) -> float:
        """Iterations done as of the last accounting. A run stopped at its failure mark
        (float error, or a stop handled before the mark's timer at the same instant) reports
        just short of it: it has not failed there yet, so its next run still does."""
        done = self.spec.iterations - self.progress.remaining
        if self.fail_at is not None and done >= self.fail_at:
            return math.nextafter(self.fail_at, 0.0)
        return done

    def ended(self, node_id: str) -> JobFinished:
        """What the node reports when the run's timer fires: completed, or its recorded
        failure (for good at the end of the job: the trace's job failed, no retries)."""
        spec = self.spec
        if self.fail_at is None:
            return JobFinished(job_id=spec.job_id, node_id=node_id,
                               iterations_done=float(spec.iterations))
        return JobFinished(job_id=spec.job_id, node_id=node_id, iterations_done=self.fail_at,
                           failure=causes.recorded_failure(self.fail_at, spec.iterations),
                           permanent=self.fail_at >= spec.iterations)


def next_mark(spec: JobSpec, done: float) -> float | None:
    """The first of the job's recorded failure marks a run from `done` has still to reach."""
    if spec.fail_at is None:
        return None
    return next((mark for mark in spec.fail_at if mark > done), None)


class SimNodeCore(CoreDefaults):
    def __init__(self, node: NodeSpec, overhead: OverheadModel,
                 profile: ThroughputTable | None = None) -> None:
        self.node = node
        self.profile = profile  # co-located (space-shared) throughputs, if known
        self.name = f"nodeagent-{node.node_id}"
        self.overhead = overhead
        self.jobs: dict[str, _Run] = {}
        self._charged: set[str] = set()  # jobs it leads that every cycle costs time
        self._order: tuple[str, ...] = ()  # those, in the order a cycle re-arms them
        self._cycles = Interest()  # on while `_charged` is not empty
        self._log: list[float] = []  # the cycles not yet charged to every run, by time
        self._seen = 0  # cycles logged so far (the log's end, as a count)
        self._last_order: tuple[str, ...] = ()  # `_order` at the last cycle logged
        self._reserve = ReserveOrder(0)  # what a cycle logged reserves (one per `_order`)
        self.gate = CommandGate()  # re-delivered and deposed-leader commands change nothing

    def _on(self, kind: str) -> str:
        """This node's own subject for `kind` (the only node subjects it may publish)."""
        return subjects.node_subject(self.node.node_id, kind)

    def subscriptions(self) -> Sequence[Subscribe]:
        commands = Subscribe(subjects.node_command(self.node.node_id))
        # Cycle announcements only matter where an interruption costs time; without that a
        # cycle changes nothing here, and a 100-node cluster is spared 100 deliveries a cycle.
        if not self.overhead.charges_per_event:
            return (commands,)
        return (commands, Subscribe(subjects.CYCLE_STARTED, wants=self._cycles))

    def _charge(self, job_id: str, charged: bool) -> None:
        """Whether cycles cost `job_id`'s run time; the node wants cycles (`_on_cycle` would
        change something) only while some run is so charged, so a cycle costs the nodes that
        run jobs, not all."""
        if charged:
            self._charged.add(job_id)
        else:
            self._charged.discard(job_id)
        self._order = tuple(j for j in self.jobs if j in self._charged)
        self._reserve = ReserveOrder(len(self._order))
        if not self._order:
            self._log.clear()  # every run was charged every cycle it saw
        self._cycles.set(bool(self._charged))

    def history_subjects(self) -> Sequence[str]:
        node = self.node.node_id
        return (subjects.node_command(node), subjects.node_subject(node, subjects.FINISHED),
                *([subjects.CYCLE_STARTED] if self.overhead.charges_per_event else []))

    def rebuild(self, history: Sequence[Recorded], now: float) -> list[Effect]:
        """The node is deterministic in its commands (with the time they were sent): replay
        them with the effects dropped (they were carried out), forget the jobs it reported
        finished, and re-arm the finish timers of the rest."""
        node = self.node.node_id
        wanted = [s.subject for s in self.subscriptions()]
        for rec in history:
            body = rec.env.body
            if isinstance(body, JobFinished):
                if body.node_id == node:
                    self._drop(body.job_id)
                    if body.failure is None:  # a failed run's job may run here again
                        self.gate.finish(body.job_id)
            elif any(subjects.matches(w, rec.subject) for w in wanted):
                if isinstance(body, NodeCommand) and body.node_id != node:
                    continue
                self.handle(rec.env, rec.env.occurred_at)
        effects: list[Effect] = []
        for run in self.jobs.values():
            if run.leader:
                self._catch_up(run)
                run.advance(now, interrupted=False)
                effects.append(run.finish_timer(now))
        log.info("node agent rebuilt", node=node, jobs=len(self.jobs))
        return effects

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        body = env.body
        if isinstance(body, CycleStarted):
            return self._on_cycle(now)
        if isinstance(body, NodeCommand):
            cmd = self.gate.admit(body)
            return [] if cmd is None else self._on_command(cmd, now)
        raise TypeError(f"node agent does not handle {env.type}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        assert isinstance(key, tuple) and key[0] == "finish"
        run = self.jobs.get(key[1])
        if run is None:
            raise KeyError(key)  # a finish timer outlives its run only by a bug
        if run.synced < self._seen and run.charged:
            # Cycles since it was last charged moved its finish on: set where the last one
            # would have set it.
            at = self._catch_up(run)
            return [SetTimer(run.key, at, PRIORITY_INPUT, self._last_order.index(key[1]))]
        self._drop(key[1])
        ended = run.ended(self.node.node_id)
        if ended.failure is None:  # done for good; a recorded failure's job runs again
            self.gate.finish(key[1])
        return [Publish(self._on(subjects.FINISHED), ended)]

    def _drop(self, job_id: str) -> _Run | None:
        """Forget a run (stopped, finished): off this node and off the cycles' charge."""
        self._charge(job_id, False)
        return self.jobs.pop(job_id, None)

    def _on_cycle(self, now: float) -> list[Effect]:
        # Every charged run's interval closes and its finish timer moves (see the module
        # docstring): logged, with the places of the re-arms reserved, or all caught up.
        order = self._order
        if not order:  # without a per-event charge nothing changes: the timers stand
            return []
        self._log.append(now)
        self._seen += 1
        self._last_order = order
        if len(self._log) < CATCH_UP_CYCLES:
            return [self._reserve]
        runs = [self.jobs[j] for j in order]
        timers: list[tuple[Hashable, float]] = [(run.key, self._catch_up(run)) for run in runs]
        self._log.clear()
        return [SetTimers(timers, PRIORITY_INPUT)]

    def _catch_up(self, run: _Run) -> float:
        """Charge a run the cycles logged since it was last charged, each at its time, as
        each would have at its cycle; its finish as the last of them would have set it (with
        none, as of its last charge)."""
        cycles = self._log
        progress = run.progress
        if run.synced < self._seen and run.charged:
            progress.charge(cycles, len(cycles) - (self._seen - run.synced), progress.per_event_s)
            run.synced = self._seen
        return progress.finish_at(progress.at, run.fail_at)

    def _on_command(self, cmd: NodeCommand, now: float) -> list[Effect]:
        effects: list[Effect] = []
        stopped: dict[str, float] = {}
        for stop in cmd.stops:
            run = self.jobs.get(stop.job_id)
            if run is not None:
                self._catch_up(run)
            run = self._drop(stop.job_id)
            if run is not None and run.leader:
                run.advance(now, interrupted=False)
                stopped[stop.job_id] = run.done()
                effects.append(CancelTimer(("finish", stop.job_id)))
        if stopped:
            effects.append(Publish(self._on(subjects.STATUS), NodeStatus(
                node_id=self.node.node_id, cycle=cmd.cycle, progress=stopped)))
        started = [self._launch(launch, now) for launch in cmd.launches]
        # Rates after every launch of the command is in: co-located jobs start together.
        for launch, run in zip(cmd.launches, started, strict=True):
            if run.leader:
                members = [self.jobs[j].spec for j in launch.colocated if j in self.jobs]
                run.progress.iteration_s, run.progress.per_event_s = job_rates(
                    run.spec, members, self.overhead, self.node.gpu_type, self.profile,
                    gpu_count(launch.placement))
                if run.progress.per_event_s:
                    self._charge(launch.job_id, True)
                effects.append(run.finish_timer(now))
        return effects

    def _launch(self, launch: Launch, now: float) -> _Run:
        spec = launch.spec
        gpus = gpu_count(launch.placement)
        leader = launch.placement[0][0] == self.node.node_id
        run = _Run(spec=spec, leader=leader, progress=RunProgress(
            total=spec.iterations,
            remaining=spec.iterations - launch.iterations_done,
            at=now,
            ready_at=now + self.overhead.restart(spec, gpus),
            iteration_s=self.overhead.iteration_time(spec, self.node.gpu_type, gpus),
            per_event_s=self.overhead.per_event(spec),
            segments=progress_segments(spec, launch.placement, launch.adaptive_batch,
                                       launch.iterations_done) if leader else None,
        ), fail_at=next_mark(spec, launch.iterations_done), synced=self._seen)
        self.jobs[spec.job_id] = run
        self._charge(spec.job_id, False)  # until its rates say otherwise
        return run
