"""Start-time forecasts: the scheduler's own cycles, run forward in virtual time.

From a copy of the scheduler's state (its running jobs with their placements and progress
estimates, its waiting jobs, its placement state and a fork of its policy) the forecaster
plays out what the scheduler would do if nothing new arrived: runs finish when their
estimates say (when the node agent would report them, `estimate.due_at`), a cycle follows
each event as the scheduler's timing asks (event-driven, slotted or round-based, with the
policy's wake-ups), and each cycle is planned by the same policy through the same `Snapshot`
and `CyclePlacement` the scheduler hands it. It stops once every job that was waiting has
started, or at the horizon or cycle cap (those jobs get no forecast). Nothing here touches the
live scheduler, the bus or a clock: the forecast is a function of its input alone (which it
uses up: `forecasting.capture` makes it a copy).

What it cannot know, it assumes: no job arrives, no operator acts, no node fails, every
launch succeeds, and runs go at the scheduler's current estimate of their speed. In a
simulation those estimates are the node agents' own arithmetic, so with no later arrivals
the forecast is the start the run will have.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from itertools import islice
from types import MappingProxyType

from domain import causes
from domain.keep_places import keep_in_plan
from domain.overhead import OverheadModel, parse_overhead
from domain.placement import CyclePlacement, Scheme
from domain.topology import Topology
from policies.base import JobView, Plan, Policy, Replan, Snapshot
from policies.mechanisms.queue_layer import AdmissionStep, replans_in_the_round
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots
from schemas.job import JobState
from schemas.tenants import TenantsConfig
from schemas.throughputs import ThroughputTable
from services.scheduler.estimate import due_at, launch_progress
from services.scheduler.in_place import open_cycle
from services.scheduler.jobs import JobRecord, admission_order
from services.scheduler.lifecycle import Transition


@dataclass(frozen=True)
class ForecastLimits:
    """How far a forecast looks: jobs not started within `horizon_s` of its time, or within
    `max_cycles` cycles, get no forecast (None)."""

    horizon_s: float = 30 * 86400.0
    max_cycles: int = 20_000


@dataclass(frozen=True)
class Timing:
    """The scheduler's re-planning and the timers it has set (see `SchedulerCore`)."""

    replan: Replan = "event"
    round_s: float = 360.0
    free_at_once: bool = False
    last_cycle_at: float | None = None
    cycle_at: float | None = None  # a cycle asked for and not yet run
    wakeup_at: float | None = None  # the policy's wake-up
    tick_at: float | None = None  # the next round


@dataclass
class ForecastInput:
    """What a forecast starts from. Everything mutable in it is the forecast's own: the
    policy a fork, the placement state a copy, the jobs copies (`forecasting.capture`)."""

    now: float
    cluster: ClusterSpec
    topology: Topology
    policy: Policy
    jobs: dict[str, JobRecord]  # every job in the policy's sight (copies)
    views: dict[str, JobView] | None = None  # what the policy saw of them; None: from `jobs`
    timing: Timing = field(default_factory=Timing)
    scheme: Scheme | None = None  # None: the policy's own
    fit: CyclePlacement | None = None  # the scheduler's placement state; None: from scratch
    moves: set[str] = field(default_factory=set)  # jobs the placement state is not told of
    cordoned: Collection[str] = frozenset()
    overhead: OverheadModel = field(default_factory=lambda: parse_overhead("none"))
    profile: ThroughputTable | None = None
    tenants: TenantsConfig | None = None
    # The tenant and queue rules with the queues' decayed usage (a copy); None: from `tenants`.
    admission: AdmissionStep | None = None


@dataclass(frozen=True)
class Forecast:
    """When each job waiting at `at` should start (None: not within the limits, or the
    policy would decline it)."""

    at: float
    starts: Mapping[str, float | None]
    cycles: int  # cycles played out

    @property
    def complete(self) -> bool:
        return all(s is not None for s in self.starts.values())


def forecast(inp: ForecastInput, limits: ForecastLimits | None = None) -> Forecast:
    """Play the scheduler forward from `inp` (which it consumes) until every waiting job
    has started, or the limits are reached."""
    return _Forward(inp).run(limits or ForecastLimits())


class _Forward:
    """The scheduler's cycle (`SchedulerCore._plan` and `_apply`) and timers, without a bus:
    what the scheduler would publish is applied to the copy at once, as the simulated node
    agents would carry it out."""

    def __init__(self, inp: ForecastInput) -> None:
        self.inp = inp
        self.policy = inp.policy
        self.jobs = inp.jobs
        self.views = dict(inp.views) if inp.views is not None else \
            {jid: rec.view() for jid, rec in inp.jobs.items()}
        self.running = {jid: rec for jid, rec in inp.jobs.items()
                        if rec.state is JobState.RUNNING and rec.run is not None}
        self.waiting = [jid for jid in inp.jobs if jid not in self.running]
        self.targets = set(self.waiting)
        self.starts: dict[str, float | None] = {}
        self.fit = inp.fit
        self.moves = set(inp.moves)
        self.admission = inp.admission
        self.replan_now = False  # the queues asked to re-plan at this cycle's instant
        if self.admission is None and inp.tenants is not None:
            self.admission = AdmissionStep(inp.tenants)
        t = inp.timing
        self.cycle_at, self.wakeup_at, self.tick_at = t.cycle_at, t.wakeup_at, t.tick_at
        self.last_cycle_at = t.last_cycle_at
        # Finish timers, as the node agents set them: (due, order set, job), and each running
        # job's current one (an entry that is not is stale).
        self.due: dict[str, float] = {}
        self._timers: list[tuple[float, int, str]] = []
        self._order = 0
        for rec in sorted(self.running.values(), key=admission_order):
            assert rec.run is not None
            self._arm(rec.spec.job_id, due_at(rec.run, rec.reported))

    # -- the loop ----------------------------------------------------------------------------
    def run(self, limits: ForecastLimits) -> Forecast:
        now = self.inp.now
        end = now + limits.horizon_s
        cycles = 0
        left = len(self.waiting)
        while left and cycles < limits.max_cycles:
            t = self._next_event()
            if t is None or t > end:
                break
            t = max(t, now)  # overdue (a live estimate behind its node): now
            self._inputs(t)
            if self.tick_at is not None and self.tick_at <= t:
                cycles += 1
                self._cycle(t, tick=True)
            if self.cycle_at is not None and self.cycle_at <= t:
                cycles += 1
                self._cycle(t, tick=False)
            left = len(self.waiting) - len(self.starts)
        starts = {jid: self.starts.get(jid) for jid in self.waiting}
        return Forecast(at=now, starts=starts, cycles=cycles)

    def _next_event(self) -> float | None:
        timers = self._timers
        while timers and self.due.get(timers[0][2]) != timers[0][0]:
            heapq.heappop(timers)
        times = [x for x in (self.cycle_at, self.wakeup_at, self.tick_at) if x is not None]
        if timers:
            times.append(timers[0][0])
        return min(times) if times else None

    def _arm(self, job_id: str, due: float) -> None:
        self.due[job_id] = due
        self._order += 1
        heapq.heappush(self._timers, (due, self._order, job_id))

    def _inputs(self, t: float) -> None:
        """What happens at `t` before its cycle: runs end, the policy's wake-up fires."""
        timers = self._timers
        while timers and timers[0][0] <= t:
            due, _, jid = heapq.heappop(timers)
            if self.due.get(jid) == due:
                self._finish(self.running[jid], t)
        if self.wakeup_at is not None and self.wakeup_at <= t:
            self.wakeup_at = None
            self._request(t, completion=False)

    def _finish(self, rec: JobRecord, t: float) -> None:
        """Its node reports it done (`reports.on_finished`, `SchedulerCore.end_run`)."""
        jid = rec.spec.job_id
        rec.iterations_done = float(rec.spec.iterations)
        rec.attained_s += t - rec.accounted_at
        rec.accounted_at = t
        rec.state = JobState.FINISHED
        del self.running[jid], self.due[jid], self.views[jid]
        self.moves.add(jid)
        self.policy.job_removed(jid)
        self._request(t, completion=True)

    def _request(self, t: float, completion: bool) -> None:
        """`SchedulerCore.request_cycle`."""
        timing = self.inp.timing
        if timing.replan == "round":
            if completion and timing.free_at_once and self.cycle_at is None:
                self.cycle_at = t
            if self.tick_at is None:
                self.tick_at = math.ceil(t / timing.round_s) * timing.round_s
            return
        if self.cycle_at is None:
            self.cycle_at = self._aligned(t)

    def _aligned(self, t: float) -> float:
        timing = self.inp.timing
        if timing.replan != "slot" or self.last_cycle_at is None:
            return t
        return max(t, self.last_cycle_at + timing.round_s)

    # -- a cycle -----------------------------------------------------------------------------
    def _cycle(self, t: float, tick: bool) -> None:
        """`SchedulerCore._cycle` and `_plan`."""
        self.last_cycle_at = t
        if tick:
            self.tick_at = t + self.inp.timing.round_s if self.views else None
        else:
            self.cycle_at = None
        running_views = []
        views = self.views
        for rec in sorted(self.running.values(), key=admission_order):
            run = rec.run
            assert run is not None
            run.advance(t, run.per_event_s)
            spec = rec.spec
            done = rec.iterations_done = spec.iterations - run.remaining
            attained = rec.attained_s = rec.attained_s + t - rec.accounted_at
            rec.accounted_at = t
            if run.per_event_s:  # the node charges the cycle too, and re-arms its finish
                self._arm(spec.job_id, due_at(run, rec.reported))
            view = views[spec.job_id] = progressed(views[spec.job_id], done, attained)
            running_views.append(view)
        snap = Snapshot(now=t, cluster=self.inp.cluster, jobs=MappingProxyType(self.views),
                        running=tuple(running_views))
        scheme = self.inp.scheme or self.policy.placement
        snap, fit, plan = open_cycle(
            self.policy, snap, scheme != "yarn" and self.inp.tenants is None,
            lambda in_place: self._placement(scheme, in_place))
        if plan is not None or self.admission is None:
            self._apply(plan if plan is not None else self.policy.plan(snap, fit), t)
            return
        plan, gate = self.admission.plan(self.policy, fit, snap)  # queues: reclaim, borrowing
        self.replan_now = replans_in_the_round(self.policy, gate, t)
        self._apply(plan, t)
        self.replan_now = False

    def _placement(self, scheme: Scheme, in_place: bool) -> CyclePlacement:
        """`SchedulerCore._placement`, on the forecast's copy."""
        fit = self.fit
        cordoned = self.inp.cordoned
        if fit is None or fit.scheme != scheme:
            previous = {jid: rec.placement for jid, rec in self.running.items()}
            fit = self.fit = CyclePlacement(self.inp.topology, scheme, previous,
                                            cordoned=cordoned)
            if in_place:
                fit.next_cycle(cordoned, in_place=True)
        else:
            for jid in self.moves:
                rec = self.running.get(jid)
                if rec is None:
                    fit.release(jid)
                else:
                    fit.bind(jid, rec.placement)
            fit.next_cycle(cordoned, in_place=in_place)
        self.moves.clear()
        return fit

    def _apply(self, plan: Plan, t: float) -> None:
        """`SchedulerCore._apply`: declines, stops, starts and moves, carried out at once."""
        for jid in plan.declined:
            if jid in self.targets:
                self.starts.setdefault(jid, None)  # rejected: it never starts
            self.jobs[jid].state = JobState.REJECTED
            del self.views[jid]
            self.policy.job_removed(jid)
        for jid in plan.stopped(self.running):
            rec = self.running.pop(jid)
            del self.due[jid]
            rec.preemptions += 1
            rec.unplace()
            rec.state = JobState.PREEMPTED
            self.moves.add(jid)
            self.views[jid] = rec.view()
        keep_in_plan(plan.run, plan.kept, plan.groups, self.running, self.inp.topology,
                     self.inp.scheme or self.policy.placement,
                     nodes_chosen=self.policy.chooses_nodes)
        for jid, slots in islice(plan.run.items(), plan.kept, None):
            rec = self.jobs[jid]
            group = plan.groups.get(jid, ())
            if rec.state is JobState.RUNNING:
                if rec.placement == slots and rec.group == group:
                    continue
                cause = causes.MIGRATED
            else:
                cause = causes.RESUMED if rec.state is JobState.PREEMPTED else causes.STARTED
                self.running[jid] = rec
                if jid in self.targets:
                    self.starts.setdefault(jid, t)
            rec.last = Transition(t, rec.state, JobState.RUNNING, cause)
            rec.state = JobState.RUNNING
            self._launch(rec, slots, group, t)
            self.views[jid] = rec.view()
        if self.inp.timing.replan != "round":
            wake = plan.wakeup_at
            self.wakeup_at = None if wake is None else max(self._aligned(wake), t)
        elif self.replan_now and self.cycle_at is None:
            self.cycle_at = t

    def _launch(self, rec: JobRecord, slots: GpuSlots, group: tuple[str, ...],
                t: float) -> None:
        """`SchedulerCore.estimate_launch`, and the node agent arming the run's finish."""
        rec.place(slots)
        rec.group, rec.accounted_at, rec.reported = group, t, rec.iterations_done
        self.moves.add(rec.spec.job_id)
        members = [self.jobs[j].spec for j in group if j in self.jobs]
        rec.run = launch_progress(rec.spec, rec.iterations_done, slots, members,
                                  self.inp.topology.type_of.get(slots[0][0]), self.inp.overhead,
                                  self.inp.profile, self.policy.adapts_batch_size, t)
        self._arm(rec.spec.job_id, due_at(rec.run, rec.reported))


def progressed(view: JobView, done: float, attained_s: float) -> JobView:
    """A running job's view a cycle later: `JobRecord.view` of the same record, only its
    progress and attained time changed (what `JobView.make` derives from them, derived the
    same way), for a fraction of the cost: a forecast builds one per running job per cycle."""
    remaining = view.spec.iterations - done
    remaining = remaining if remaining > 0.0 else 0.0
    return view._replace(iterations_done=done, remaining_iterations=remaining,
                         remaining_s=remaining * view.spec.iteration_time_s,
                         attained_s=attained_s)
