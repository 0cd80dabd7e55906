"""Node and trainer faults, as the scheduler acts on them (the state and its rules are in
`services.scheduler.liveness`): heartbeats and reconcile, lost and restarted nodes, runs that
vanish or never start, failed trainers and their retries; the health each heartbeat reports
is acted on in `services.scheduler.health`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from domain import causes
from schemas import subjects
from schemas.causes import RECORDED_FAILURE
from schemas.events import STOP_RECONCILE, JobFinished, NodeCommand, NodeHeartbeat, Stop
from schemas.job import JobState
from schemas.status import Status, StatusCode
from services.runtime.effects import PRIORITY_INPUT, Effect, Publish, SetTimer
from services.scheduler import health
from services.scheduler.jobs import JobRecord
from services.scheduler.liveness import launch_key, lost_key, retry_key

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore

# Heartbeats in a row that must miss a run its node has launched before it counts as vanished.
VANISHED_AFTER_BEATS = 2


def on_heartbeat(core: SchedulerCore, hb: NodeHeartbeat, now: float) -> list[Effect]:
    node = hb.node_id
    if node not in core.topology.index:
        raise ValueError(f"heartbeat from node {node!r}, which is not in the cluster")
    # First: a report the node could not have made is refused before anything changes.
    healthy = health.on_health(core, node, hb.health, now)
    deadline, returned = core.faults.beat(node, hb.interval_s, now)
    effects: list[Effect] = [SetTimer(lost_key(node), deadline, PRIORITY_INPUT), *healthy]
    running = core.jobs.running
    # What the node lists has started there; reconcile: stop whatever it runs that is no
    # longer placed there, ...
    stale = []
    for jid in hb.jobs:
        rec = running.get(jid)
        if rec is not None and rec.on_node(node):
            rec.confirmed = True
        else:
            stale.append(jid)
    if stale:
        effects.append(Publish(subjects.node_command(node), NodeCommand(
            node_id=node, cycle=-1, stops=tuple(
                Stop(job_id=jid, reason=STOP_RECONCILE) for jid in stale))))
    # ... and count a run the node should list (it has carried out the launch) and does not;
    # a finish report may still be on its way, so only the second such beat counts.
    if hb.handled is not None:
        listed = set(hb.jobs)
        for rec in [r for r in running.values() if r.launched_by is not None
                    and r.launched_by <= hb.handled and r.on_node(node)]:
            rec.unseen = 0 if rec.spec.job_id in listed else rec.unseen + 1
            if rec.unseen >= VANISHED_AFTER_BEATS:
                effects += _on_vanished(core, rec, node, now)
    if returned:
        effects += core.request_cycle(now, "node-returned")
    return effects


def _on_vanished(core: SchedulerCore, rec: JobRecord, node: str, now: float,
                 why: str | None = None) -> list[Effect]:
    """A run its node no longer has (it never started, or ended unreported): stop what is
    left of it, and count it as a failed attempt (backoff, then retry or fail)."""
    jid = rec.spec.job_id
    core.end_run(rec, rec.reported, now)  # its last checkpoint, as far as we know
    why = why or f"its run vanished from node {node} (not in {VANISHED_AFTER_BEATS} heartbeats)"
    lost = JobFinished(job_id=jid, node_id=node, iterations_done=rec.reported, failure=why)
    return [core.plan_out(stops=[Stop(job_id=jid, reason=why)]),
            *on_trainer_failed(core, rec, lost, now)]


def await_start(core: SchedulerCore, rec: JobRecord, now: float) -> list[Effect]:
    """Arm the launch's deadline: a run its node does not show started by then (never
    handled, refused, lost on the way) frees its GPUs and counts as a failed attempt. Only on
    nodes that send heartbeats, so simulations never arm it."""
    timeout = core.faults.liveness.launch_timeout_s
    leader = rec.placement[0][0]
    if not timeout or leader not in core.faults.watched or rec.launched_by is None:
        return []
    return [SetTimer(launch_key(rec.spec.job_id, rec.launched_by), now + timeout,
                     PRIORITY_INPUT)]


def on_start_due(core: SchedulerCore, job_id: str, launched_by: tuple[int, int],
                 now: float) -> list[Effect]:
    rec = core.jobs.running.get(job_id)
    if rec is None or rec.launched_by != launched_by or rec.confirmed:
        return []  # started, or a later run of it, or no longer running
    node = rec.placement[0][0]
    timeout = core.faults.liveness.launch_timeout_s
    return _on_vanished(core, rec, node, now, causes.launch_timeout_failure(node, timeout))


def on_lost(core: SchedulerCore, node: str, now: float) -> list[Effect]:
    core.faults.lost.add(node)
    return requeue_node(core, node, "lost", now)


def requeue_node(core: SchedulerCore, node: str, why: str, now: float) -> list[Effect]:
    """Take every job off `node` (lost, or its agent restarted): each goes back to the queue
    from the progress last reported, and its other nodes stop their ranks."""
    hit = [rec for rec in core.jobs.running_in_order() if rec.on_node(node)]
    if not hit:
        return []
    stops: list[Stop] = []
    transitions: list[Effect] = []
    for rec in hit:
        jid = rec.spec.job_id
        core.jobs.clear_running(jid)
        rec.attained_s += now - rec.accounted_at
        rec.accounted_at = now
        rec.iterations_done = rec.reported  # its last checkpoint, as far as we know
        rec.unplace()
        rec.preemptions += 1
        stops.append(Stop(job_id=jid, reason=f"node {node} {why}"))
        transitions.append(core.transition(rec, JobState.PREEMPTED,
                                           causes.requeued(node, why), now))
        # Preempted between cycles: the policy keeps what it knows of the job (its queue, its
        # admission) and sees it wait again.
        view = rec.view()
        core.views.set(jid, view)
        core.policy.job_requeued(view)
    return [core.plan_out(stops=stops), *transitions, *core.request_cycle(now, f"node-{why}")]


def on_trainer_failed(core: SchedulerCore, rec: JobRecord, msg: JobFinished, now: float
                      ) -> list[Effect]:
    """The job's trainer failed on its own (already off the running set and the policy's
    sight): back off and retry, or fail the job once it is out of attempts. A failure the
    trace records is retried whatever the count (see `recorded`)."""
    jid = rec.spec.job_id
    failure = str(msg.failure)
    rec.unplace()
    rec.reported = msg.iterations_done
    replayed = recorded(rec, msg)
    at = None if msg.permanent else core.faults.fail(jid, now, budgeted=not replayed)
    n = core.faults.failures.get(jid, 0)
    effects: list[Effect]
    if at is None:
        rec.ended_at = now
        reason = (f"{failure} (not retried)" if msg.permanent else
                  f"trainer failed {n} time(s), last on {msg.node_id}: {failure}")
        rec.status = Status(code=StatusCode.FAILED, reason=reason, decided_by="retry")
        effects = [core.transition(rec, JobState.FAILED, causes.failed(failure), now)]
    else:
        rec.ended_at = None
        cause = (causes.recorded_restart(msg.node_id, failure, n, at) if replayed else
                 causes.retry(msg.node_id, failure, n, core.faults.retry.max_attempts - 1, at))
        effects = [core.transition(rec, JobState.PREEMPTED, cause, now),
                   SetTimer(retry_key(jid), at, PRIORITY_INPUT)]
    return effects + core.request_cycle(now, "completion")


def recorded(rec: JobRecord, msg: JobFinished) -> bool:
    """Whether a failed run is one of the failures the job's trace records (`fail_at`),
    replayed by a simulated node: said so, at one of the job's marks. Only such a failure is
    retried beyond the budget; the scheduler admits `fail_at` only where nodes replay it."""
    marks = rec.spec.fail_at
    return (marks is not None and msg.failure is not None
            and msg.failure.startswith(RECORDED_FAILURE) and msg.iterations_done in marks)


def on_retry_due(core: SchedulerCore, job_id: str, now: float) -> list[Effect]:
    if core.faults.backoff.pop(job_id, None) is None:
        return []  # cancelled or suspended meanwhile
    core.show(core.jobs[job_id])
    return core.request_cycle(now, "retry")
