"""The scheduler core: admits jobs, runs scheduling cycles, records every transition.

A cycle runs after every input at its instant (lower priority). It announces itself
(`CycleStarted`, so node agents close their accounting), hands the policy a frozen snapshot and
a fresh placement state, then publishes what changed (`PlanDecided`) and one `JobTransition` per
job that moved.

Progress of running jobs is an estimate between reports: the scheduler advances it with the
same pure progress model the node agents use (`domain.overhead.advance`), and any
report from a node (a stop, a finish, a heartbeat) overrides it. In a simulation the estimate is
exact, so no per-cycle status round trip is needed.

Cycles are event-driven (an arrival, a completion or a policy wake-up asks for one),
round-based (one every `round_s`), or slotted (event-driven, but never sooner than `round_s`
after the previous cycle, so events closer together share one cycle: ElasticFlow's scheduling
slots, which its simulator counts from the last event handled), chosen per run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from pydantic import ValidationError

import policies
from domain.causes import failed_cause, launch_timeout_failure, requeue_cause, retry_cause
from domain.overhead import (
    OverheadModel,
    Segments,
    advance,
    advance_segments,
    job_rates,
    parse_overhead,
    progress_segments,
)
from domain.placement import SCHEMES, CyclePlacement, Scheme, Topology
from policies.admission import TenantGate, submit_refusal
from policies.base import JobView, Plan, Policy, Snapshot
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.events import (
    STOP_RECONCILE,
    CycleStarted,
    Envelope,
    GpuSlots,
    JobFinished,
    JobTransition,
    Launch,
    NodeCommand,
    NodeHeartbeat,
    NodeInfo,
    NodeStatus,
    OperatorCommand,
    PlanDecided,
    Stop,
    gpu_count,
)
from schemas.job import JobSpec, JobState, SubmitJob
from schemas.status import Status, StatusCode
from schemas.tenants import TenantsConfig
from schemas.throughputs import ThroughputTable
from services.runtime.bus import decode_submit
from services.runtime.effects import (
    PRIORITY_CYCLE,
    PRIORITY_INPUT,
    CancelTimer,
    Effect,
    Publish,
    SetTimer,
)
from services.runtime.service import CoreDefaults, Subscribe
from services.scheduler.lifecycle import Transition, check
from services.scheduler.liveness import (
    LivenessConfig,
    NodeFaults,
    RetryPolicy,
    launch_key,
    lost_key,
    retry_key,
)

Replan = Literal["event", "round", "slot"]
NAME = "scheduler"
# Heartbeats in a row that must miss a run its node has launched before it counts as vanished.
VANISHED_AFTER_BEATS = 2


@dataclass(frozen=True)
class SchedulerConfig:
    replan: Replan = "event"
    round_s: float = 360.0
    overhead: OverheadModel = field(default_factory=lambda: parse_overhead("none"))
    placement: Scheme | None = None  # None: the policy's own scheme
    profile: ThroughputTable | None = None  # co-located throughputs (Gavel's space sharing)
    # Rounds: re-plan as soon as a job finishes, so its GPUs do not idle until the round ends
    # (Gavel's simulator leaves them idle).
    free_at_once: bool = False
    seed: int = 0  # for policies set at run time (`loom set-policy`)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)  # lost nodes
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # failed trainers
    # Quotas and fair share in front of the policy (policies.admission); None: no limits.
    tenants: TenantsConfig | None = None

    def __post_init__(self) -> None:
        if self.replan not in ("event", "round", "slot"):
            raise ValueError(f"replan must be 'event', 'round' or 'slot', not {self.replan!r}")
        if self.round_s <= 0:
            raise ValueError("round_s must be positive")
        if self.placement is not None and self.placement not in SCHEMES:
            raise ValueError(f"unknown placement {self.placement!r}; known: {', '.join(SCHEMES)}")


# Every distinct set of nodes jobs have run on, once: a record keeps its set for good (a late
# report of a finished job is checked against it), and a million jobs on a few nodes each
# would otherwise hold a million copies of a few sets (216 bytes each).
_HOST_SETS: dict[frozenset[str], frozenset[str]] = {}


@dataclass(slots=True)
class JobRecord:
    spec: JobSpec
    admitted: int = 0  # admission order: ties between jobs resolve in this order
    state: JobState | None = None
    iterations_done: float = 0.0
    reported: float = 0.0  # progress at launch or as a node last reported it (a lost node's
    # jobs restart from here)
    remaining: float = 0.0  # estimated iterations left while running
    progress_at: float = 0.0  # the estimate is as of this time
    ready_at: float = 0.0  # a restart's overhead ends here
    iteration_s: float = 0.0  # effective, while running (alone or interleaved)
    per_event_s: float = 0.0
    segments: Segments | None = None  # speed by progress (goodput-profiled jobs)
    group: tuple[str, ...] = ()  # jobs sharing its GPUs, itself included; () when alone
    attained_s: float = 0.0
    accounted_at: float = 0.0
    placement: GpuSlots = ()
    preemptions: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    status: Status | None = None
    history: list[Transition] = field(default_factory=list)
    launched_by: tuple[int, int] | None = None  # (term, cycle) of the plan of its current run
    unseen: int = 0  # heartbeats since then that should have listed its run and did not
    confirmed: bool = False  # its node has shown the current run (heartbeat, progress, end)
    hosts: frozenset[str] = frozenset()  # every node it has been placed on: the only ones
    # whose word about it counts

    def place(self, slots: GpuSlots) -> None:
        self.placement = slots
        nodes = {n for n, _ in slots}
        if not nodes <= self.hosts:
            hosts = self.hosts.union(nodes)
            self.hosts = _HOST_SETS.setdefault(hosts, hosts)

    def view(self) -> JobView:
        running = self.state is JobState.RUNNING
        return JobView.make(self.spec, running, self.iterations_done, self.attained_s,
                            self.preemptions, gpu_count(self.placement) if running else 0)


def _on_node(rec: JobRecord, node: str) -> bool:
    """Whether the job's placement uses `node`."""
    return any(n == node for n, _ in rec.placement)


def _admission_order(rec: JobRecord) -> int:
    return rec.admitted


class SchedulerCore(CoreDefaults):
    name = NAME

    def __init__(self, cluster: ClusterSpec, policy: Policy, config: SchedulerConfig) -> None:
        self.cluster = cluster
        self.topology = Topology(cluster)
        self.policy = policy
        self.config = config
        self.jobs: dict[str, JobRecord] = {}
        self._views: dict[str, JobView] = {}  # active jobs only
        self._running: dict[str, JobRecord] = {}
        self._types = set(cluster.gpus_by_type)
        self.cycle = 0
        self._cycle_requested = False
        self._tick_armed = False
        self._wakeup_armed = False
        self._last_cycle_at: float | None = None
        self._trigger = "start"
        self.last_plan: Plan | None = None
        self.tenancy: TenantGate | None = None  # the last cycle's admission step, with tenants
        self._waiting_by_tenant: Counter[str] = Counter()  # queued or preempted jobs
        self.held: set[str] = set()  # suspended by an operator: out of the policy's sight
        self.drained: set[str] = set()  # nodes that take no new work
        self.faults = NodeFaults(config.liveness, config.retry)  # lost nodes, failed trainers
        self.term = 0  # the leader's election term, stamped on every plan (fencing)
        # Policies that co-adapt batch sizes (Pollux) let goodput-profiled jobs choose theirs.
        self._adaptive_batch = policy.adapts_batch_size

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
        if isinstance(body, SubmitJob):
            return self._on_submit(body, env.event_id, now)
        if isinstance(body, JobFinished):
            return self._on_finished(body, now)
        if isinstance(body, NodeStatus):
            self._on_status(body)
            return []
        if isinstance(body, NodeHeartbeat):
            return self._on_heartbeat(body, now)
        if isinstance(body, OperatorCommand):
            return self._on_operator(body, now)
        if isinstance(body, NodeInfo):
            index = {g.uuid: g.index for g in body.gpus}
            self.topology.learn_links(body.node_id, [
                (index[x.a], index[x.b]) for x in body.links
                if x.kind == "nvlink" and x.a in index and x.b in index])
            # An agent announces itself when it starts: what it ran before died with it.
            return self._requeue_node(body.node_id, "restarted", now)
        raise TypeError(f"scheduler does not handle {env.type}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if key == "cycle" or key == "tick":
            return self._cycle(key, now)
        if key == "wakeup":
            self._wakeup_armed = False
            return self._request_cycle(now, "wakeup")
        if isinstance(key, tuple) and len(key) == 2:
            if key == lost_key(key[1]):
                return self._on_lost(key[1], now)
            if key == retry_key(key[1]):
                return self._on_retry_due(key[1], now)
        if isinstance(key, tuple) and len(key) == 3 and key == launch_key(key[1], key[2]):
            return self._on_start_due(key[1], key[2], now)
        raise KeyError(key)

    # -- queries -----------------------------------------------------------------------------
    def status(self, job_id: str) -> Status:
        """Why a job is where it is ("why is my job pending")."""
        rec = self.jobs[job_id]
        if job_id in self.held:
            return Status(code=StatusCode.SUSPENDED, reason="suspended by an operator",
                          decided_by="operator")
        if job_id in self.faults.backoff:
            return Status(code=StatusCode.WAITING_BY_POLICY, reason=(
                f"trainer failed {self.faults.failures[job_id]} time(s); retrying at "
                f"{self.faults.backoff[job_id]:g}"), decided_by="retry")
        if rec.state is not None and rec.state.waiting:
            waiting = self.policy.waiting_status(job_id)
            held = None if self.tenancy is None else self.tenancy.status_for(job_id, rec.spec)
            if held is not None:
                return held.model_copy(update={"queue_position": waiting.queue_position})
            return waiting
        if rec.state is JobState.RUNNING:  # derived on demand: cheaper than one per launch
            return Status(code=StatusCode.RUNNING, reason=rec.history[-1].cause,
                          decided_by=self.policy.name)
        assert rec.status is not None
        return rec.status

    def adopt(self, launched: dict[str, tuple[float, tuple[str, ...]]], now: float
              ) -> list[Effect]:
        """Take over `self.jobs` as rebuilt from the stream (`services.scheduler.recovery`):
        running jobs resume their estimates from when they launched (`launched`: job →
        (time, co-located group)), every active job not suspended goes to the policy in
        admission order, and a cycle is requested if there is anything to schedule (an empty
        cycle would still count, and a live log replayed from its first submission would
        number its cycles one short)."""
        for jid, rec in sorted(self.jobs.items(), key=lambda kv: kv[1].admitted):
            if rec.state is None or rec.state.terminal:
                continue
            if rec.state is JobState.RUNNING:
                at, group = launched.get(jid, (now, ()))
                self._running[jid] = rec
                self.estimate_launch(rec, rec.placement, group, at)
            if jid not in self.held:
                view = self._views[jid] = rec.view()
                self.policy.job_added(view)
                if rec.state is JobState.RUNNING:
                    self.policy.job_running(view)
        return self._request_cycle(now, "recovered") if self._views else []

    @property
    def active(self) -> int:
        return len(self._views)

    # -- inputs ------------------------------------------------------------------------------
    def _on_submit(self, sub: SubmitJob, event_id: str, now: float) -> list[Effect]:
        job_id = sub.job_id or f"job-{event_id}"
        if job_id in self.jobs:
            self._check_resubmission(job_id, sub)
            return []  # the same job again (a retried submit, a re-delivery): handled once
        try:
            spec = sub.to_spec(job_id, now)
        except ValidationError as exc:
            msg = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            return self._reject(job_id, None, StatusCode.REJECTED_INVALID, msg, now)
        if spec.gpus > self.cluster.total_gpus:
            reason = f"needs {spec.gpus} GPUs; the cluster has {self.cluster.total_gpus}"
            return self._reject(job_id, spec, StatusCode.REJECTED_TOO_LARGE, reason, now)
        if spec.gpu_type is not None and spec.gpu_type not in self._types:
            reason = f"GPU type {spec.gpu_type!r} not in cluster ({', '.join(sorted(self._types))})"
            return self._reject(job_id, spec, StatusCode.REJECTED_TOO_LARGE, reason, now)
        refusal = self.policy.admit(spec)
        if refusal is not None:
            return self._reject(job_id, spec, StatusCode.REJECTED_BY_POLICY, refusal, now)
        if self.config.tenants is not None:
            waiting = self._waiting_by_tenant[spec.tenant]
            refusal = submit_refusal(self.config.tenants, spec, waiting)
            if refusal is not None:
                return self._reject(job_id, spec, StatusCode.REJECTED_BY_QUOTA, refusal, now)
        rec = JobRecord(spec=spec, admitted=len(self.jobs), accounted_at=now)
        self.jobs[job_id] = rec
        effects: list[Effect] = [
            self._transition(rec, JobState.QUEUED, "admitted", now, with_spec=True)
        ]
        view = rec.view()
        self._views[job_id] = view
        self.policy.job_added(view)
        effects += self._request_cycle(now, "arrival")
        return effects

    def _check_resubmission(self, job_id: str, sub: SubmitJob) -> None:
        """A submission under a taken id is accepted, once, only if it is the same job: a
        different one raises, so the shell dead-letters it with the reason (it would
        otherwise vanish without a word, and its submitter wait for a job never queued)."""
        known = self.jobs[job_id].spec
        try:
            same = sub.to_spec(job_id, known.submit_time_s) == known
        except ValidationError:
            same = False
        if not same:
            raise ValueError(f"duplicate job id {job_id!r}: a different job was submitted "
                             "under it; submit with another id (or none, to get one)")

    def _reject(
        self, job_id: str, spec: JobSpec | None, code: StatusCode, reason: str, now: float
    ) -> list[Effect]:
        status = Status(code=code, reason=reason, decided_by="admission")
        if spec is None:
            # Keep a record so the rejection is visible, with a placeholder spec.
            return [Publish(subjects.JOB_TRANSITION, JobTransition(
                job_id=job_id, state=JobState.REJECTED, previous=None, cause=reason,
                status=status))]
        rec = JobRecord(spec=spec, status=status, accounted_at=now)
        self.jobs[job_id] = rec
        return [self._transition(rec, JobState.REJECTED, reason, now, with_spec=True)]

    def _on_finished(self, msg: JobFinished, now: float) -> list[Effect]:
        _check_host(self.jobs.get(msg.job_id), msg.job_id, msg.node_id)
        rec = self._running.get(msg.job_id)
        if rec is None:
            return self._finished_while_requeued(msg, now)
        cause = "completed"
        if rec.placement[0][0] != msg.node_id:
            # A run the job has since left (its stop still on the way) may have done all the
            # work: the job is done, as the placer takes it (it stops the run the job has
            # now). A partial or failed report from there is stale.
            if not _all_work_done(rec, msg):
                return []
            cause = f"completed on {msg.node_id}, a node it had left"
        self._end_run(rec, msg.iterations_done, now)
        if msg.failure is not None:
            return self._on_trainer_failed(rec, msg, now)
        rec.status = Status(code=StatusCode.FINISHED, reason="completed", decided_by=msg.node_id)
        effects: list[Effect] = [self._transition(rec, JobState.FINISHED, cause, now)]
        return effects + self._request_cycle(now, "completion")

    def _end_run(self, rec: JobRecord, iterations_done: float, now: float) -> None:
        """The job's run is over (done, failed or vanished): off the running set and out of
        the policy's sight, its attained service counted up to now."""
        jid = rec.spec.job_id
        rec.iterations_done = iterations_done
        rec.attained_s += now - rec.accounted_at
        rec.accounted_at = now
        rec.ended_at = now
        del self._running[jid]
        del self._views[jid]
        self.policy.job_removed(jid)

    def _finished_while_requeued(self, msg: JobFinished, now: float) -> list[Effect]:
        """A node taken for lost may yet complete the job before it hears of the requeue, and
        a run taken for vanished may have completed with its report delayed: a report of all
        the work finishes the job (its agent would never start it again, and elsewhere it
        would train twice), backing off or not. Anything else is stale or a duplicate."""
        rec = self.jobs.get(msg.job_id)
        if rec is None or rec.state is not JobState.PREEMPTED or not _all_work_done(rec, msg):
            return []
        rec.iterations_done = msg.iterations_done
        rec.ended_at = now
        self.faults.backoff.pop(msg.job_id, None)  # its retry, if any, is called off
        if self._views.pop(msg.job_id, None) is not None:  # backing off: out of sight already
            self.policy.job_removed(msg.job_id)
        rec.status = Status(code=StatusCode.FINISHED, reason="completed", decided_by=msg.node_id)
        return [self._transition(rec, JobState.FINISHED, "completed while requeued", now),
                *self._request_cycle(now, "completion")]

    def _on_status(self, msg: NodeStatus) -> None:
        """A node's report is the truth; it replaces the estimate."""
        for job_id in msg.progress:
            _check_host(self.jobs.get(job_id), job_id, msg.node_id)
        if msg.node_id in self.faults.lost:
            return  # its jobs have been requeued; what it says of them is stale
        for job_id, done in msg.progress.items():
            rec = self.jobs[job_id]
            if rec.state is not None and not rec.state.terminal:
                rec.iterations_done = rec.reported = done
                rec.remaining = rec.spec.iterations - done
                rec.confirmed = rec.confirmed or _on_node(rec, msg.node_id)

    # -- operators ---------------------------------------------------------------------------
    def _on_operator(self, cmd: OperatorCommand, now: float) -> list[Effect]:
        """Apply an operator's command; a command that cannot apply raises (dead-lettered)."""
        if cmd.command == "set-policy":
            return self._set_policy(str(cmd.policy), now)
        if cmd.command in ("drain", "undrain"):
            node = str(cmd.node_id)
            if node not in self.topology.index:
                raise ValueError(f"{cmd.command}: no node {node!r} in the cluster")
            if cmd.command == "drain":
                self.drained.add(node)
            else:
                self.drained.discard(node)
            return self._request_cycle(now, cmd.command)
        jid = str(cmd.job_id)
        rec = self.jobs.get(jid)
        if rec is None or rec.state is None or rec.state.terminal:
            raise ValueError(f"{cmd.command}: no active job {jid!r}")
        if cmd.command == "resume":
            if jid not in self.held:
                return []
            self.held.discard(jid)
            view = self._views[jid] = rec.view()
            self.policy.job_added(view)
            return self._request_cycle(now, "resume")
        if jid in self.held and cmd.command == "suspend":
            return []
        effects = self._take_off(rec, cmd.command, now)
        if jid in self.faults.backoff:  # out of sight already; the operator decides now
            del self.faults.backoff[jid]
            effects.append(CancelTimer(retry_key(jid)))
        elif jid not in self.held:
            del self._views[jid]
            self.policy.job_removed(jid)
        if cmd.command == "suspend":
            self.held.add(jid)
        else:  # cancel
            self.held.discard(jid)
            rec.ended_at = now
            rec.status = Status(code=StatusCode.CANCELLED,
                                reason=f"cancelled by {cmd.requested_by}", decided_by="operator")
            effects.append(self._transition(rec, JobState.FAILED, "cancelled", now))
        return effects + self._request_cycle(now, cmd.command)

    def _take_off(self, rec: JobRecord, why: str, now: float) -> list[Effect]:
        """Stop a running job now (outside a cycle); nothing for a waiting one."""
        jid = rec.spec.job_id
        if self._running.pop(jid, None) is None:
            return []
        self._advance(rec, now, 0.0)  # the node reports the exact figure when it stops
        rec.placement, rec.group = (), ()
        effects: list[Effect] = [self._plan_out(stops=[Stop(job_id=jid, reason=why)])]
        if why == "suspend":
            rec.preemptions += 1
            effects.append(self._transition(rec, JobState.PREEMPTED, "suspended", now))
        return effects

    # -- node faults (see services/scheduler/liveness.py) ---------------------------------------
    def _on_heartbeat(self, hb: NodeHeartbeat, now: float) -> list[Effect]:
        node = hb.node_id
        if node not in self.topology.index:
            raise ValueError(f"heartbeat from node {node!r}, which is not in the cluster")
        deadline, returned = self.faults.beat(node, hb.interval_s, now)
        effects: list[Effect] = [SetTimer(lost_key(node), deadline, PRIORITY_INPUT)]
        # What the node lists has started there; reconcile: stop whatever it runs that is no
        # longer placed there, ...
        stale = []
        for jid in hb.jobs:
            if self._runs_on(jid, node):
                self._running[jid].confirmed = True
            else:
                stale.append(jid)
        if stale:
            effects.append(Publish(subjects.node_command(node), NodeCommand(
                node_id=node, cycle=-1, stops=tuple(
                    Stop(job_id=jid, reason=STOP_RECONCILE) for jid in stale))))
        # ... and count a run the node should list (it has carried out the launch) and does
        # not; a finish report may still be on its way, so only the second such beat counts.
        if hb.handled is not None:
            listed = set(hb.jobs)
            for rec in [r for r in self._running.values() if r.launched_by is not None
                        and r.launched_by <= hb.handled and _on_node(r, node)]:
                rec.unseen = 0 if rec.spec.job_id in listed else rec.unseen + 1
                if rec.unseen >= VANISHED_AFTER_BEATS:
                    effects += self._on_vanished(rec, node, now)
        if returned:
            effects += self._request_cycle(now, "node-returned")
        return effects

    def _on_vanished(self, rec: JobRecord, node: str, now: float,
                     why: str | None = None) -> list[Effect]:
        """A run its node no longer has (it never started, or ended unreported): stop what is
        left of it, and count it as a failed attempt (backoff, then retry or fail)."""
        jid = rec.spec.job_id
        self._end_run(rec, rec.reported, now)  # its last checkpoint, as far as we know
        why = why or f"its run vanished from node {node} (not in {VANISHED_AFTER_BEATS} heartbeats)"
        lost = JobFinished(job_id=jid, node_id=node, iterations_done=rec.reported, failure=why)
        return [self._plan_out(stops=[Stop(job_id=jid, reason=why)]),
                *self._on_trainer_failed(rec, lost, now)]

    def _await_start(self, rec: JobRecord, now: float) -> list[Effect]:
        """Arm the launch's deadline: a run its node does not show started by then (never
        handled, refused, lost on the way) frees its GPUs and counts as a failed attempt.
        Only on nodes that send heartbeats, so simulations never arm it."""
        timeout = self.faults.liveness.launch_timeout_s
        leader = rec.placement[0][0]
        if not timeout or leader not in self.faults.watched or rec.launched_by is None:
            return []
        return [SetTimer(launch_key(rec.spec.job_id, rec.launched_by), now + timeout,
                         PRIORITY_INPUT)]

    def _on_start_due(self, job_id: str, launched_by: tuple[int, int],
                      now: float) -> list[Effect]:
        rec = self._running.get(job_id)
        if rec is None or rec.launched_by != launched_by or rec.confirmed:
            return []  # started, or a later run of it, or no longer running
        node = rec.placement[0][0]
        timeout = self.faults.liveness.launch_timeout_s
        return self._on_vanished(rec, node, now, launch_timeout_failure(node, timeout))

    def _plan_out(self, stops: Sequence[Stop] = (), launches: Sequence[Launch] = (),
                  busy_gpus: int = 0) -> Publish:
        """A change to what runs where, for the placer: stamped with this cycle and this
        leader's term (the placer refuses older terms), in a cycle or outside one."""
        return Publish(subjects.PLAN_DECIDED, PlanDecided(
            cycle=self.cycle, launches=tuple(launches), stops=tuple(stops),
            running=len(self._running), busy_gpus=busy_gpus, term=self.term))

    def _runs_on(self, job_id: str, node: str) -> bool:
        rec = self._running.get(job_id)
        return rec is not None and _on_node(rec, node)

    def _on_lost(self, node: str, now: float) -> list[Effect]:
        self.faults.lost.add(node)
        return self._requeue_node(node, "lost", now)

    def _requeue_node(self, node: str, why: str, now: float) -> list[Effect]:
        """Take every job off `node` (lost, or its agent restarted): each goes back to the
        queue from the progress last reported, and its other nodes stop their ranks."""
        hit = [rec for rec in sorted(self._running.values(), key=_admission_order)
               if _on_node(rec, node)]
        if not hit:
            return []
        stops: list[Stop] = []
        transitions: list[Effect] = []
        for rec in hit:
            jid = rec.spec.job_id
            del self._running[jid]
            rec.attained_s += now - rec.accounted_at
            rec.accounted_at = now
            rec.iterations_done = rec.reported  # its last checkpoint, as far as we know
            rec.remaining = rec.spec.iterations - rec.reported
            rec.placement, rec.group = (), ()
            rec.preemptions += 1
            stops.append(Stop(job_id=jid, reason=f"node {node} {why}"))
            transitions.append(self._transition(rec, JobState.PREEMPTED,
                                                requeue_cause(node, why), now))
            # Preempted between cycles: the policy keeps what it knows of the job (its queue,
            # its admission) and sees it wait again.
            view = self._views[jid] = rec.view()
            self.policy.job_requeued(view)
        return [self._plan_out(stops=stops), *transitions,
                *self._request_cycle(now, f"node-{why}")]

    def _on_trainer_failed(self, rec: JobRecord, msg: JobFinished, now: float) -> list[Effect]:
        """The job's trainer failed on its own (already off the running set and the policy's
        sight): back off and retry, or fail the job once it is out of attempts."""
        jid = rec.spec.job_id
        failure = str(msg.failure)
        rec.placement, rec.group = (), ()
        rec.reported = msg.iterations_done
        at = None if msg.permanent else self.faults.fail(jid, now)
        n = self.faults.failures.get(jid, 0)
        effects: list[Effect]
        if at is None:
            rec.ended_at = now
            reason = (f"{failure} (not retried)" if msg.permanent else
                      f"trainer failed {n} time(s), last on {msg.node_id}: {failure}")
            rec.status = Status(code=StatusCode.FAILED, reason=reason, decided_by="retry")
            effects = [self._transition(rec, JobState.FAILED, failed_cause(failure), now)]
        else:
            rec.ended_at = None
            cause = retry_cause(msg.node_id, failure, n,
                                self.faults.retry.max_attempts - 1, at)
            effects = [self._transition(rec, JobState.PREEMPTED, cause, now),
                       SetTimer(retry_key(jid), at, PRIORITY_INPUT)]
        return effects + self._request_cycle(now, "completion")

    def _on_retry_due(self, job_id: str, now: float) -> list[Effect]:
        if self.faults.backoff.pop(job_id, None) is None:
            return []  # cancelled or suspended meanwhile
        rec = self.jobs[job_id]
        view = self._views[job_id] = rec.view()
        self.policy.job_added(view)
        return self._request_cycle(now, "retry")

    def _set_policy(self, name: str, now: float) -> list[Effect]:
        self.switch_policy(name)
        return self._request_cycle(now, "policy")

    def switch_policy(self, name: str) -> None:
        """Hand every active job to a new policy (`set-policy`, or a rebuild that saw one)."""
        policy = policies.make(name)
        policy.configure(seed=self.config.seed, round_s=self.config.round_s,
                         profile=self.config.profile)
        for view in self._views.values():
            policy.job_added(view)
        self.policy = policy
        self._adaptive_batch = policy.adapts_batch_size

    def record(self, rec: JobRecord, state: JobState, cause: str, now: float) -> Publish:
        """Record a transition decided outside a cycle (a rebuild's repair of its table)."""
        return self._transition(rec, state, cause, now)

    # -- cycles ------------------------------------------------------------------------------
    def _request_cycle(self, now: float, trigger: str) -> list[Effect]:
        if self.config.replan == "round":
            effects: list[Effect] = []
            if (trigger == "completion" and self.config.free_at_once
                    and not self._cycle_requested):
                self._cycle_requested = True
                self._trigger = trigger
                effects.append(SetTimer("cycle", now, PRIORITY_CYCLE))
            if not self._tick_armed:
                self._tick_armed = True
                r = self.config.round_s
                effects.append(SetTimer("tick", math.ceil(now / r) * r, PRIORITY_CYCLE))
            return effects
        if self._cycle_requested:
            return []
        self._cycle_requested = True
        self._trigger = trigger
        return [SetTimer("cycle", self._aligned(now), PRIORITY_CYCLE)]

    def _aligned(self, t: float) -> float:
        """Slotted runs act a slot after the previous cycle at the earliest; others at t."""
        if self.config.replan != "slot" or self._last_cycle_at is None:
            return t
        return max(t, self._last_cycle_at + self.config.round_s)

    def _cycle(self, key: Hashable, now: float) -> list[Effect]:
        self.cycle += 1
        self._last_cycle_at = now
        self._cycle_requested = False
        effects: list[Effect] = []
        if self._running:
            trigger = "round" if key == "tick" else self._trigger
            effects.append(Publish(subjects.CYCLE_STARTED,
                                   CycleStarted(cycle=self.cycle, trigger=trigger)))
        if key == "tick":
            self._tick_armed = False
            if self._views:
                self._tick_armed = True
                effects.append(SetTimer("tick", now + self.config.round_s, PRIORITY_CYCLE))
        return effects + self._plan(now)

    def _plan(self, now: float) -> list[Effect]:
        running_views = []
        # Admission order, not start order: policies that visit running jobs one by one (e.g.
        # Tiresias demotions) must not depend on when a job last resumed.
        for rec in sorted(self._running.values(), key=_admission_order):
            self._advance(rec, now, rec.per_event_s)
            view = rec.view()
            self._views[rec.spec.job_id] = view
            running_views.append(view)
        snap = Snapshot(
            now=now,
            cluster=self.cluster,
            jobs=MappingProxyType(self._views),
            running=tuple(running_views),
        )
        previous = {jid: rec.placement for jid, rec in self._running.items()}
        scheme = self.config.placement or self.policy.placement
        # A lost node is cordoned like a drained one (its jobs have already been requeued).
        cordoned = self.drained | self.faults.lost if self.faults.lost else self.drained
        fit = CyclePlacement(self.topology, scheme, previous, cordoned=cordoned)
        if self.config.tenants is not None:
            self.tenancy = TenantGate(fit, snap, self.config.tenants)
            plan = self.policy.plan(snap, self.tenancy)
        else:
            plan = self.policy.plan(snap, fit)
        self.last_plan = plan
        return self._apply(plan, now)

    def _advance(self, rec: JobRecord, now: float, lost_s: float) -> None:
        """Bring a running job's estimated progress and attained time up to `now`, as its
        node agent accounts it (see module docstring); `lost_s`: what the interruption costs."""
        if rec.segments is not None:
            rec.remaining = advance_segments(rec.remaining, rec.spec.iterations,
                                             rec.progress_at, rec.ready_at, now,
                                             rec.segments, lost_s)
        else:
            rec.remaining = advance(rec.remaining, rec.progress_at, rec.ready_at, now,
                                    rec.iteration_s, lost_s)
        rec.progress_at = now
        rec.iterations_done = rec.spec.iterations - rec.remaining
        rec.attained_s += now - rec.accounted_at
        rec.accounted_at = now

    def _apply(self, plan: Plan, now: float) -> list[Effect]:
        transitions: list[Effect] = []
        stops: list[Stop] = []
        launches: list[Launch] = []
        for jid, reason in plan.declined.items():
            rec = self.jobs[jid]
            if rec.state is not JobState.QUEUED or jid in plan.run:
                raise ValueError(f"policy declined job {jid}, which is {rec.state}")
            del self._views[jid]
            self.policy.job_removed(jid)
            rec.ended_at = now
            rec.status = Status(code=StatusCode.REJECTED_BY_POLICY, reason=reason,
                                decided_by=self.policy.name)
            transitions.append(self._transition(rec, JobState.REJECTED, reason, now))
        for jid in [j for j in self._running if j not in plan.run]:
            rec = self._running.pop(jid)
            rec.preemptions += 1
            rec.placement, rec.group = (), ()
            stops.append(Stop(job_id=jid, reason="preempted"))
            transitions.append(self._transition(rec, JobState.PREEMPTED, "preempted", now))
            view = rec.view()
            self._views[jid] = view
        for jid, slots in plan.run.items():
            rec = self.jobs[jid]
            group = plan.groups.get(jid, ())
            if rec.state is JobState.RUNNING:
                if rec.placement == slots and rec.group == group:
                    continue
                # New GPUs or new partners: the job restarts under its new conditions.
                stops.append(Stop(job_id=jid, reason="migrated"))
                cause = "migrated"
            else:
                cause = "resumed" if rec.state is JobState.PREEMPTED else "started"
                if rec.started_at is None:
                    rec.started_at = now
                self._running[jid] = rec
            self.estimate_launch(rec, slots, group, now)
            rec.launched_by, rec.unseen, rec.confirmed = (self.term, self.cycle), 0, False
            launches.append(Launch(job_id=jid, spec=rec.spec, placement=slots,
                                   iterations_done=rec.iterations_done, colocated=group,
                                   adaptive_batch=self._adaptive_batch))
            transitions.append(self._transition(rec, JobState.RUNNING, cause, now))
            transitions += self._await_start(rec, now)
            self._views[jid] = rec.view()
        effects: list[Effect] = []
        if stops or launches:
            busy = len({(node, i) for r in self._running.values() for node, gpus in r.placement
                        for i in gpus})
            effects.append(self._plan_out(stops, launches, busy_gpus=busy))
        effects += transitions
        if self.config.replan != "round":
            # Always re-arm or clear: a stale wake-up would add a cycle the policy did not ask for.
            if plan.wakeup_at is not None:
                effects.append(SetTimer("wakeup", max(self._aligned(plan.wakeup_at), now),
                                        PRIORITY_INPUT))
            elif self._wakeup_armed:
                effects.append(CancelTimer("wakeup"))
            self._wakeup_armed = plan.wakeup_at is not None
        return effects

    def estimate_launch(self, rec: JobRecord, slots: GpuSlots, group: tuple[str, ...],
                        now: float) -> None:
        """Start the progress estimate of a job launched at `now` as the node agent will run
        it (see module docstring); also used when a recovering scheduler rebuilds its state."""
        model = self.config.overhead
        rec.place(slots)
        rec.group = group
        rec.accounted_at = now
        rec.remaining = rec.spec.iterations - rec.iterations_done
        rec.reported = rec.iterations_done
        rec.progress_at = now
        size = gpu_count(slots)
        rec.ready_at = now + model.restart(rec.spec, size)
        members = [self.jobs[j].spec for j in group if j in self.jobs]
        gpu_type = self.topology.type_of.get(slots[0][0])
        rec.iteration_s, rec.per_event_s = job_rates(rec.spec, members, model, gpu_type,
                                                     self.config.profile, size)
        rec.segments = progress_segments(rec.spec, slots, self._adaptive_batch,
                                         rec.iterations_done)

    def _transition(
        self, rec: JobRecord, state: JobState, cause: str, now: float, *, with_spec: bool = False
    ) -> Publish:
        check(rec.state, state, rec.spec.job_id)
        if rec.state is not None and rec.state.waiting:
            self._waiting_by_tenant[rec.spec.tenant] -= 1
        if state.waiting:
            self._waiting_by_tenant[rec.spec.tenant] += 1
        rec.history.append(Transition(now, rec.state, state, cause))
        previous, rec.state = rec.state, state
        gpus = gpu_count(rec.placement) if state is JobState.RUNNING else 0
        return Publish(subjects.JOB_TRANSITION, JobTransition(
            job_id=rec.spec.job_id, state=state, previous=previous, cause=cause, gpus=gpus,
            placement=rec.placement if state is JobState.RUNNING else (),
            iterations_done=rec.iterations_done,
            status=rec.status if state.terminal else None,
            spec=rec.spec if with_spec else None))


def _check_host(rec: JobRecord | None, job_id: str, node: str) -> None:
    """A node speaks only of jobs placed on it (now or before): anything else is forged or
    misrouted, and raises (the shell dead-letters the event with this reason)."""
    if rec is None:
        raise ValueError(f"node {node} reports on job {job_id!r}, which the scheduler does "
                         "not know")
    if node not in rec.hosts:
        where = ", ".join(sorted(rec.hosts)) or "no node yet"
        raise ValueError(f"node {node} reports on job {job_id!r}, which was never placed "
                         f"there (placed on: {where})")


def _all_work_done(rec: JobRecord, msg: JobFinished) -> bool:
    """A report of the job's whole work, without failure: the job is done, whichever run
    (even one it has left) sent it."""
    return msg.failure is None and msg.iterations_done >= rec.spec.iterations
