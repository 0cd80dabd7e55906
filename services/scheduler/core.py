"""The scheduler core: dispatches its inputs, times its cycles, plans and applies each plan.

A cycle runs after every input at its instant (lower priority). It announces itself
(`CycleStarted`, so node agents close their accounting), hands the policy a frozen snapshot and
the placement state (kept across cycles, told what started, stopped or moved since), then
publishes what changed (`PlanDecided`) and one `JobTransition` per job that moved.

Progress of running jobs is an estimate between reports, with the same estimator the node
agents account with (`domain.progress.RunProgress`); any report from a node (a stop, a finish,
a heartbeat) overrides it. In a simulation the estimate is exact, so no per-cycle status round
trip is needed.

Cycles are event-driven (an arrival, a completion or a policy wake-up asks for one),
round-based (one every `round_s`), or slotted (event-driven, but never sooner than `round_s`
after the previous cycle, so events closer together share one cycle: ElasticFlow's scheduling
slots, which its simulator counts from the last event handled), chosen per run.

What happens to jobs lives beside the core: the job table and its transitions (`jobs`),
submissions (`intake`), node reports (`reports`), node and trainer faults (`faults`), operators'
commands (`operators`), what people and tools ask (`queries`), rebuilding from the stream
(`recovery`), waiting jobs' start forecasts (`forecasting`, after a cycle when configured),
the queues' status (`queue_status`, likewise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from itertools import islice
from types import MappingProxyType
from typing import Any

from domain import causes
from domain.keep_places import keep_in_plan
from domain.placement import CyclePlacement, Scheme
from domain.topology import Topology
from policies.base import JobView, Plan, Policy, RunningJobs, Snapshot
from policies.mechanisms.admission import TenantGate
from policies.mechanisms.queue_layer import AdmissionStep, replans_in_the_round
from policies.mechanisms.queues import QueueGate
from schemas import subjects
from schemas.causes import Cause
from schemas.cluster import ClusterSpec
from schemas.events import (
    CycleStarted,
    Envelope,
    GpuSlots,
    JobFinished,
    Launch,
    NodeHeartbeat,
    NodeInfo,
    NodeStatus,
    OperatorCommand,
    PlanDecided,
    Stop,
)
from schemas.job import JobState, SubmitJob
from schemas.queue_status import QueueStatus
from schemas.status import Status, StatusCode
from services.runtime.bus import decode_submit
from services.runtime.effects import (
    PRIORITY_CYCLE,
    PRIORITY_INPUT,
    CancelTimer,
    Effect,
    Publish,
    SetTimer,
)
from services.runtime.service import CoreDefaults, Recorded, Subscribe
from services.runtime.trusted import trusted
from services.scheduler import (
    faults,
    forecasting,
    intake,
    operators,
    queries,
    queue_status,
    recovery,
    reports,
)
from services.scheduler.config import SchedulerConfig
from services.scheduler.estimate import launch_progress
from services.scheduler.in_place import open_cycle
from services.scheduler.jobs import JobRecord, JobTable
from services.scheduler.liveness import NodeFaults, launch_key, lost_key, retry_key
from services.scheduler.views import ActiveViews

NAME = "scheduler"
LAZY_VIEWS_FROM = 64  # running jobs from which their views are made only when read


class SchedulerCore(CoreDefaults):
    name = NAME

    def __init__(self, cluster: ClusterSpec, policy: Policy, config: SchedulerConfig) -> None:
        self.cluster = cluster
        self.topology = Topology(cluster)
        self.policy = policy
        self.config = config
        self.jobs = JobTable()
        self.views = ActiveViews(self.jobs)  # what the policy sees: active jobs not held back
        self.gpu_types = set(cluster.gpus_by_type)
        self.cycle = 0
        # The timers it has set, by when they fire (None: not set): what a forecast of its
        # next cycles starts from (`forecasting`).
        self.cycle_at: float | None = None  # a cycle asked for
        self.tick_at: float | None = None  # the next round
        self.wakeup_at: float | None = None  # the policy's wake-up
        self.last_cycle_at: float | None = None
        self._trigger = "start"
        self.last_plan: Plan | None = None
        self.fit: CyclePlacement | None = None  # kept across cycles (see `_placement`)
        self.forecasts = forecasting.ForecastState()  # start-time forecasts (`forecasting`)
        self.tenancy: TenantGate | QueueGate | None = None  # the last cycle's admission gate
        # Tenants' and queues' rules, kept across cycles (queues' usage decays over time).
        self.admission = None if config.tenants is None else AdmissionStep(config.tenants)
        self.queue_reports = queue_status.Published()  # the last queue status published
        self.drained: set[str] = set()  # nodes that take no new work
        self.faults = NodeFaults(config.liveness, config.retry)  # lost nodes, failed trainers
        self.term = 0  # the leader's election term, stamped on every plan (fencing)
        # Policies that co-adapt batch sizes (Pollux) let goodput-profiled jobs choose theirs.
        self._adaptive_batch = policy.adapts_batch_size
        self._handlers: dict[type, Callable[[Any, float], list[Effect]]] = {
            JobFinished: lambda msg, now: reports.on_finished(self, msg, now),
            NodeStatus: lambda msg, now: reports.on_status(self, msg),
            NodeHeartbeat: lambda msg, now: faults.on_heartbeat(self, msg, now),
            OperatorCommand: lambda msg, now: operators.on_command(self, msg, now),
            NodeInfo: self._on_node_info,
        }

    # -- Core protocol -----------------------------------------------------------------------
    def subscriptions(self) -> Sequence[Subscribe]:
        return (
            Subscribe(subjects.JOB_SUBMIT, decode_submit),
            Subscribe(subjects.JOB_FINISHED),
            Subscribe(subjects.NODE_STATUS),
            Subscribe(subjects.OPERATOR),
            Subscribe(subjects.NODE_INFO),
            Subscribe(subjects.NODE_HEARTBEAT),
        )

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        body = env.body
        if isinstance(body, SubmitJob):  # the only input that needs its envelope (the id)
            return intake.on_submit(self, body, env.event_id, now)
        handler = self._handlers.get(type(body))
        if handler is None:
            raise TypeError(f"scheduler does not handle {env.type}")
        return handler(body, now)

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if key == "cycle" or key == "tick":
            return self._cycle(key, now)
        if key == "wakeup":
            self.wakeup_at = None
            return self.request_cycle(now, "wakeup")
        if isinstance(key, tuple) and len(key) == 2:
            if key == lost_key(key[1]):
                return faults.on_lost(self, key[1], now)
            if key == retry_key(key[1]):
                return faults.on_retry_due(self, key[1], now)
        if isinstance(key, tuple) and len(key) == 3 and key == launch_key(key[1], key[2]):
            return faults.on_start_due(self, key[1], key[2], now)
        raise KeyError(key)

    def history_subjects(self) -> Sequence[str]:
        return recovery.HISTORY

    def rebuild(self, history: Sequence[Recorded], now: float) -> list[Effect]:
        return recovery.rebuild(self, history, now)

    def state(self, now: float) -> dict[str, Any]:
        return queries.state(self, now)

    def status(self, job_id: str) -> Status:
        """Why a job is where it is ("why is my job pending")."""
        return queries.status(self, job_id)

    def queues(self, now: float) -> QueueStatus:
        """The queues' quotas, use and waiting jobs at `now` (`loom queues`)."""
        return queue_status.queue_status(self, now)

    @property
    def active(self) -> int:
        return len(self.views)

    def _on_node_info(self, info: NodeInfo, now: float) -> list[Effect]:
        index = {g.uuid: g.index for g in info.gpus}
        self.topology.learn_links(info.node_id, [
            (index[x.a], index[x.b]) for x in info.links
            if x.kind == "nvlink" and x.a in index and x.b in index])
        # An agent announces itself when it starts: what it ran before died with it.
        return faults.requeue_node(self, info.node_id, "restarted", now)

    # -- shared by the handlers --------------------------------------------------------------
    def transition(self, rec: JobRecord, state: JobState, cause: Cause, now: float, *,
                   with_spec: bool = False) -> Publish:
        return self.jobs.transition(rec, state, cause, now, with_spec=with_spec)

    def show(self, rec: JobRecord) -> None:
        """Put a job (back) in the policy's sight: admitted, retried, resumed."""
        view = rec.view()
        self.views.set(rec.spec.job_id, view)
        self.policy.job_added(view)

    def hide(self, job_id: str) -> None:
        """Take a job out of the policy's sight."""
        self.views.drop(job_id)
        self.policy.job_removed(job_id)

    def end_run(self, rec: JobRecord, iterations_done: float, now: float) -> None:
        """The job's run is over (done, failed or vanished): off the running set and out of
        the policy's sight, its attained service counted up to now."""
        self.jobs.sync(rec)
        rec.iterations_done = iterations_done
        rec.attained_s += now - rec.accounted_at
        rec.accounted_at = now
        rec.ended_at = now
        self.jobs.clear_running(rec.spec.job_id)
        self.hide(rec.spec.job_id)

    def plan_out(self, stops: Sequence[Stop] = (), launches: Sequence[Launch] = (),
                 busy_gpus: int = 0) -> Publish:
        """A change to what runs where, for the placer: stamped with this cycle and this
        leader's term (the placer refuses older terms), in a cycle or outside one."""
        return Publish(subjects.PLAN_DECIDED, trusted(
            PlanDecided,
            cycle=self.cycle, launches=tuple(launches), stops=tuple(stops),
            running=len(self.jobs.running), busy_gpus=busy_gpus, term=self.term))

    def switch_policy(self, name: str) -> None:
        """Hand every active job to a new policy (`set-policy`, or a rebuild that saw one)."""
        policy = self.config.make_policy(name)
        for view in self.views.values():
            policy.job_added(view)
            if view.running:  # else a policy with a waiting index walks it twice
                policy.job_running(view)
        self.policy = policy
        self._adaptive_batch = policy.adapts_batch_size

    def adopt(self, launched: dict[str, tuple[float, tuple[str, ...]]], now: float
              ) -> list[Effect]:
        """Take over the job table as rebuilt from the stream: running jobs resume their
        estimates from when they launched (`launched`: job → (time, co-located group)), every
        active job not suspended goes to the policy in admission order, and a cycle is
        requested if there is anything to schedule (an empty cycle would still count, and a
        live log replayed from its first submission would number its cycles one short)."""
        self.fit = None  # placements as the rebuilt table has them, from scratch
        for jid, rec in sorted(self.jobs.items(), key=lambda kv: kv[1].admitted):
            if rec.state is None or rec.state.terminal:
                continue
            if rec.state is JobState.RUNNING:
                at, group = launched.get(jid, (now, ()))
                self.jobs.set_running(rec)
                self.estimate_launch(rec, rec.placement, group, at)
            if jid not in self.jobs.held:
                self.show(rec)
                if rec.state is JobState.RUNNING:
                    self.policy.job_running(self.views[jid])
        return self.request_cycle(now, "recovered") if self.views else []

    # -- cycles ------------------------------------------------------------------------------
    def request_cycle(self, now: float, trigger: str) -> list[Effect]:
        if self.config.replan == "round":
            effects: list[Effect] = []
            if (trigger == "completion" and self.config.free_at_once
                    and self.cycle_at is None):
                self.cycle_at = now
                self._trigger = trigger
                effects.append(SetTimer("cycle", now, PRIORITY_CYCLE))
            if self.tick_at is None:
                r = self.config.round_s
                self.tick_at = math.ceil(now / r) * r
                effects.append(SetTimer("tick", self.tick_at, PRIORITY_CYCLE))
            return effects
        if self.cycle_at is not None:
            return []
        self.cycle_at = self._aligned(now)
        self._trigger = trigger
        return [SetTimer("cycle", self.cycle_at, PRIORITY_CYCLE)]

    def _aligned(self, t: float) -> float:
        """Slotted runs act a slot after the previous cycle at the earliest; others at t."""
        if self.config.replan != "slot" or self.last_cycle_at is None:
            return t
        return max(t, self.last_cycle_at + self.config.round_s)

    def _cycle(self, key: Hashable, now: float) -> list[Effect]:
        self.cycle += 1
        self.last_cycle_at = now
        self.cycle_at = None
        effects: list[Effect] = []
        if self.jobs.running:
            trigger = "round" if key == "tick" else self._trigger
            effects.append(Publish(subjects.CYCLE_STARTED,
                                   trusted(CycleStarted, cycle=self.cycle,
                                           trigger=trigger)))
        if key == "tick":
            self.tick_at = None
            if self.views:
                self.tick_at = now + self.config.round_s
                effects.append(SetTimer("tick", self.tick_at, PRIORITY_CYCLE))
        effects += self._plan(now)
        if self.config.forecast_every_s is not None:  # never changes what was decided
            effects += forecasting.after_cycle(self, now)
        if self.config.queue_status_every_s is not None:  # nor does this
            effects += queue_status.after_cycle(self, now)
        return effects

    def _plan(self, now: float) -> list[Effect]:
        jobs = self.jobs
        jobs.pack_ended()
        jobs.log_cycle(now)  # charges every running job (lazily)
        views = self.views
        views.outdate()
        running: Sequence[JobView]
        reported = jobs.take_reported()
        if len(jobs.running) < LAZY_VIEWS_FROM:
            # Few running jobs: their views at once, and every view read at C speed (a
            # policy's walk reads many).
            running, seen = self._running_views(), views.plain()
        else:  # many: each running job's view made only if read
            running = RunningJobs(jobs.running.keys(), self._running_views, reported,
                                  jobs.in_admission_order, jobs.irregular(), jobs.running_spec,
                                  jobs.running_left, jobs.running_attained)
            seen = MappingProxyType(views)
        snap = Snapshot(now=now, cluster=self.cluster, jobs=seen, running=running)
        scheme = self.config.placement or self.policy.placement
        snap, fit, plan = open_cycle(
            self.policy, snap, scheme != "yarn" and self.config.tenants is None,
            lambda in_place: self._placement(scheme, in_place))
        if plan is None and self.admission is not None:
            plan, self.tenancy = self.admission.plan(self.policy, fit, snap)
        elif plan is None:
            plan = self.policy.plan(snap, fit)
        self.last_plan = plan
        if isinstance(running, RunningJobs):
            running.close()  # read while planning, or never: `_apply` changes what runs
        return self._apply(plan, now)

    def _running_views(self) -> tuple[JobView, ...]:
        # Admission order, not start order: policies that visit running jobs one by one (e.g.
        # Tiresias demotions) must not depend on when a job last resumed.
        return self.views.make_running(self.jobs.running_in_order())

    def _placement(self, scheme: Scheme, in_place: bool) -> CyclePlacement:
        """This cycle's placement state: the last cycle's, told which jobs started, stopped or
        moved since (a new one when the scheme changed), with running jobs held for the walk
        to re-place them, or `in_place`."""
        # A lost node is cordoned like a drained one (its jobs have already been requeued).
        cordoned = self.drained | self.faults.lost if self.faults.lost else self.drained
        moves = self.jobs.take_moves()
        fit = self.fit
        if fit is None or fit.scheme != scheme:
            previous = {jid: rec.placement for jid, rec in self.jobs.running.items()}
            fit = self.fit = CyclePlacement(self.topology, scheme, previous, cordoned=cordoned)
            if in_place:
                fit.next_cycle(cordoned, in_place=True)
            return fit
        for jid in moves:
            rec = self.jobs.running.get(jid)
            if rec is None:
                fit.release(jid)
            else:
                fit.bind(jid, rec.placement)
        fit.next_cycle(cordoned, in_place=in_place)
        return fit

    def _apply(self, plan: Plan, now: float) -> list[Effect]:
        transitions: list[Effect] = []
        stops: list[Stop] = []
        launches: list[Launch] = []
        running = self.jobs.running
        for jid, reason in plan.declined.items():
            rec = self.jobs[jid]
            if rec.state is not JobState.QUEUED or jid in plan.run:
                raise ValueError(f"policy declined job {jid}, which is {rec.state}")
            self.hide(jid)
            rec.ended_at = now
            rec.status = Status(code=StatusCode.REJECTED_BY_POLICY, reason=reason,
                                decided_by=self.policy.name)
            transitions.append(self.transition(rec, JobState.REJECTED, causes.rejected(reason),
                                               now))
        # A plan that keeps what it does not list names its preempted jobs: put only those
        # in order, not every running job (`Plan.stopped`).
        stopped = (self.jobs.in_running_order(plan.preempted) if plan.stay
                   else plan.stopped(running))
        for jid in stopped:
            rec = self.jobs.clear_running(jid)
            rec.preemptions += 1
            rec.unplace()
            stops.append(trusted(Stop, job_id=jid, reason="preempted"))
            lender = None if self.tenancy is None else self.tenancy.reclaimed.get(jid)
            cause = causes.PREEMPTED if lender is None else causes.reclaimed(lender)
            transitions.append(self.transition(rec, JobState.PREEMPTED, cause, now))
            self.views.set(jid, rec.view())
        groups = plan.groups
        keep_in_plan(plan.run, plan.kept, groups, running, self.topology,
                     self.config.placement or self.policy.placement,
                     nodes_chosen=self.policy.chooses_nodes)
        for jid, slots in islice(plan.run.items(), plan.kept, None):
            rec = running.get(jid) or self.jobs[jid]
            group = groups.get(jid, ()) if groups else ()
            if rec.state is JobState.RUNNING:
                if rec.placement == slots and rec.group == group:
                    continue
                # New GPUs or new partners: the job restarts under its new conditions.
                stops.append(trusted(Stop, job_id=jid, reason="migrated"))
                cause = causes.MIGRATED
            else:
                cause = causes.RESUMED if rec.state is JobState.PREEMPTED else causes.STARTED
                if rec.started_at is None:
                    rec.started_at = now
                self.jobs.set_running(rec)
            self.estimate_launch(rec, slots, group, now)
            rec.launched_by, rec.unseen, rec.confirmed = (self.term, self.cycle), 0, False
            launches.append(trusted(Launch, job_id=jid, spec=rec.spec, placement=slots,
                                    iterations_done=rec.iterations_done, colocated=group,
                                    adaptive_batch=self._adaptive_batch))
            transitions.append(self.transition(rec, JobState.RUNNING, cause, now))
            transitions += faults.await_start(self, rec, now)
            self.views.set(jid, rec.view())
        effects: list[Effect] = []
        if stops or launches:
            effects.append(self.plan_out(stops, launches, busy_gpus=self.jobs.busy_gpus()))
        effects += transitions
        if self.config.replan != "round":
            # Always re-arm or clear: a stale wake-up would add a cycle the policy did not ask for.
            if plan.wakeup_at is not None:
                self.wakeup_at = max(self._aligned(plan.wakeup_at), now)
                effects.append(SetTimer("wakeup", self.wakeup_at, PRIORITY_INPUT))
            elif self.wakeup_at is not None:
                self.wakeup_at = None
                effects.append(CancelTimer("wakeup"))
        elif (self.tenancy is not None and self.cycle_at is None
              and replans_in_the_round(self.policy, self.tenancy, now)):
            self.cycle_at, self._trigger = now, "wakeup"
            effects.append(SetTimer("cycle", now, PRIORITY_CYCLE))
        return effects

    def estimate_launch(self, rec: JobRecord, slots: GpuSlots, group: tuple[str, ...],
                        now: float) -> None:
        """Start the progress estimate of a job launched at `now` as the node agent will run
        it (see module docstring); also used when a recovering scheduler rebuilds its state."""
        self.jobs.sync(rec)  # a job that moves starts again from where the cycles left it
        rec.place(slots)
        rec.group = group
        self.jobs.placed(rec)
        rec.accounted_at = now
        rec.reported = rec.iterations_done
        members = [self.jobs[j].spec for j in group if j in self.jobs]
        rec.run = launch_progress(rec.spec, rec.iterations_done, slots, members,
                                  self.topology.type_of.get(slots[0][0]), self.config.overhead,
                                  self.config.profile, self._adaptive_batch, now)

