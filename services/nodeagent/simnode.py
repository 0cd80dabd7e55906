"""A simulated node: advances its jobs from their iteration times under an overhead model.

Jobs that share GPUs (Muri's interleaving) each run at the group's interleaved iteration time
(`overhead.job_rates`).

Only the first node of a job's placement (its leader) accounts progress and reports the finish;
the other nodes of a gang just hold their GPUs. At each scheduling cycle a node closes every
running job's interval (charging the model's per-event cost) and re-arms the job's completion
timer: completion = now + remaining iterations × iteration time, as the Muri and Tiresias
simulators predict it. When it stops a job it reports the progress the job had reached.

It does so lazily, with the same arithmetic in the same order: the cycles are kept in a
`CycleLog` (shared by the nodes of a fleet, `services.nodeagent.simfleet`), and a run is
charged the cycles logged since it was last charged when its timer comes up (a cycle only
moves a finish later), when it stops, or when the fleet catches every run up.

A job that replays a trace's failures (`JobSpec.fail_at`) fails on cue: its timer is set to
the earlier of its next unreached failure mark and its end, and at a mark the node reports the
run failed there, a recorded failure (for good at a mark equal to its iterations).

`SimNode` is one node's state machine; it returns effects as a core does, and its fleet core
carries them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from domain import causes
from domain.compiled import mypyc_attr
from domain.overhead import OverheadModel, job_rates, progress_segments
from domain.progress import RunProgress, charge_many
from schemas import subjects
from schemas.cluster import NodeSpec
from schemas.events import JobFinished, Launch, NodeCommand, NodeStatus, gpu_count
from schemas.job import JobSpec
from schemas.throughputs import ThroughputTable
from services.nodeagent.gate import CommandGate
from services.runtime.effects import PRIORITY_INPUT, CancelTimer, Effect, Publish, SetTimer
from services.runtime.trusted import trusted


def finish_key(node_id: str, job_id: str) -> tuple[str, str, str]:
    """The key of a run's finish timer: a job may lead on two nodes of a fleet for a moment
    (launched on one before the other's stop arrives)."""
    return ("finish", node_id, job_id)


@dataclass(slots=True)
class CycleLog:
    """The scheduling cycles some run has not yet been charged, by time: `seen` counts every
    cycle logged, `times` holds the last `len(times)` of them."""

    times: list[float] = field(default_factory=list)
    seen: int = 0

    def log(self, now: float) -> None:
        self.times.append(now)
        self.seen += 1

    def charge_all(self, runs: Sequence[NodeRun]) -> None:
        """Charge each charged run the cycles logged since its last charge, as one batch."""
        seen, times = self.seen, self.times
        due = [run for run in runs if run.synced < seen and run.charged]
        charge_many([(run.progress, len(times) - (seen - run.synced)) for run in due], times)
        for run in due:
            run.synced = seen


@mypyc_attr(allow_interpreted_subclasses=True)  # copyable: forecasts fork the fleet
@dataclass(slots=True, init=False)  # a written __init__ compiles (see services.runtime.effects)
class NodeRun:
    spec: JobSpec
    leader: bool
    progress: RunProgress
    fail_at: float | None  # the recorded failure mark this run ends at (None: none)
    synced: int  # the fleet's cycles charged to it, counted from the fleet's first
    key: tuple[str, str, str]  # its finish timer's (`finish_key`), made once

    def __init__(self, spec: JobSpec, leader: bool, progress: RunProgress,
                 fail_at: float | None = None, synced: int = 0,
                 key: tuple[str, str, str] = ("", "", "")) -> None:
        self.spec = spec
        self.leader = leader
        self.progress = progress
        self.fail_at = fail_at
        self.synced = synced
        self.key = key

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
            return trusted(JobFinished, job_id=spec.job_id, node_id=node_id,
                           iterations_done=float(spec.iterations))
        return trusted(JobFinished, job_id=spec.job_id, node_id=node_id,
                       iterations_done=self.fail_at,
                       failure=causes.recorded_failure(self.fail_at, spec.iterations),
                       permanent=self.fail_at >= spec.iterations)


def next_mark(spec: JobSpec, done: float) -> float | None:
    """The first of the job's recorded failure marks a run from `done` has still to reach."""
    if spec.fail_at is None:
        return None
    return next((mark for mark in spec.fail_at if mark > done), None)


class SimNode:
    """One simulated node's runs. Every cycle costs its charged runs (`order`) time; the fleet
    logs cycles once for all its nodes and reserves their re-arms' places in one block, in
    which this node's runs take `cycle_order`'s places (its charged runs as of the last cycle)
    after the fleet's `offset` of the nodes before it."""

    def __init__(self, node: NodeSpec, overhead: OverheadModel, profile: ThroughputTable | None,
                 cycles: CycleLog) -> None:
        self.node = node
        self.node_id = node.node_id
        self.overhead = overhead
        self.profile = profile  # co-located (space-shared) throughputs, if known
        self.cycles = cycles
        self.producer = f"nodeagent-{node.node_id}"
        self.jobs: dict[str, NodeRun] = {}
        self._charged: set[str] = set()  # jobs it leads that every cycle costs time
        self.order: tuple[str, ...] = ()  # those, in the order a cycle re-arms them
        self.cycle_order: tuple[str, ...] = ()  # `order` at the last cycle logged
        self.gate = CommandGate()  # re-delivered and deposed-leader commands change nothing

    def _publish(self, kind: str, body: JobFinished | NodeStatus) -> Publish:
        """On this node's own subject for `kind` (the only node subjects it may publish)."""
        return Publish(subjects.node_subject(self.node_id, kind), body, producer=self.producer)

    def charge(self, job_id: str, charged: bool) -> None:
        """Whether cycles cost `job_id`'s run time (a new `order` where that changes it)."""
        if charged:
            self._charged.add(job_id)
        elif job_id in self._charged:
            self._charged.discard(job_id)
        else:
            return
        self.order = tuple(j for j in self.jobs if j in self._charged)

    def drop(self, job_id: str) -> NodeRun | None:
        """Forget a run (stopped, finished): off this node and off the cycles' charge."""
        self.charge(job_id, False)
        return self.jobs.pop(job_id, None)

    def catch_up(self, run: NodeRun) -> float:
        """Charge a run the cycles logged since it was last charged, each at its time, as
        each would have at its cycle; its finish as the last of them would have set it (with
        none, as of its last charge)."""
        self.cycles.charge_all((run,))
        return run.progress.finish_at(run.progress.at, run.fail_at)

    def on_finish_timer(self, job_id: str, offset: int) -> list[Effect]:
        """The run's timer came up: early (cycles since its last charge moved its finish on:
        set again where the last one would have set it, `offset` places into the fleet's
        block), or at its end."""
        run = self.jobs.get(job_id)
        if run is None:
            raise KeyError(job_id)  # a finish timer outlives its run only by a bug
        if run.synced < self.cycles.seen and run.charged:
            at = self.catch_up(run)
            return [SetTimer(run.key, at, PRIORITY_INPUT, offset + self.cycle_order.index(job_id))]
        self.drop(job_id)
        ended = run.ended(self.node_id)
        if ended.failure is None:  # done for good; a recorded failure's job runs again
            self.gate.finish(job_id)
        return [self._publish(subjects.FINISHED, ended)]

    def on_command(self, cmd: NodeCommand, now: float) -> list[Effect]:
        effects: list[Effect] = []
        stopped: dict[str, float] = {}
        for stop in cmd.stops:
            run = self.jobs.get(stop.job_id)
            if run is not None:
                self.catch_up(run)
            run = self.drop(stop.job_id)
            if run is not None and run.leader:
                run.advance(now, interrupted=False)
                stopped[stop.job_id] = run.done()
                effects.append(CancelTimer(run.key))
        if stopped:
            effects.append(self._publish(subjects.STATUS, trusted(
                NodeStatus,
                node_id=self.node_id, cycle=cmd.cycle, progress=stopped)))
        started = [self._launch(launch, now) for launch in cmd.launches]
        # Rates after every launch of the command is in: co-located jobs start together.
        for launch, run in zip(cmd.launches, started, strict=True):
            if run.leader:
                members = [self.jobs[j].spec for j in launch.colocated if j in self.jobs]
                run.progress.iteration_s, run.progress.per_event_s = job_rates(
                    run.spec, members, self.overhead, self.node.gpu_type, self.profile,
                    gpu_count(launch.placement))
                if run.progress.per_event_s:
                    self.charge(launch.job_id, True)
                effects.append(run.finish_timer(now))
        return effects

    def _launch(self, launch: Launch, now: float) -> NodeRun:
        spec = launch.spec
        gpus = gpu_count(launch.placement)
        leader = launch.placement[0][0] == self.node_id
        run = NodeRun(spec=spec, leader=leader, progress=RunProgress(
            total=spec.iterations,
            remaining=spec.iterations - launch.iterations_done,
            at=now,
            ready_at=now + self.overhead.restart(spec, gpus),
            iteration_s=self.overhead.iteration_time(spec, self.node.gpu_type, gpus),
            per_event_s=self.overhead.per_event(spec),
            segments=progress_segments(spec, launch.placement, launch.adaptive_batch,
                                       launch.iterations_done) if leader else None,
        ), fail_at=next_mark(spec, launch.iterations_done), synced=self.cycles.seen,
            key=finish_key(self.node_id, spec.job_id))
        self.jobs[spec.job_id] = run
        self.charge(spec.job_id, False)  # until its rates say otherwise
        return run
