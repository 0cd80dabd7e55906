"""What nodes report of their runs: a finish (done, or failed) and a stop's progress. A node
speaks only of jobs placed on it; its report is the truth and replaces the estimate."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from domain import causes
from schemas.events import JobFinished, NodeStatus
from schemas.job import JobState
from schemas.status import Status, StatusCode
from services.runtime.effects import Effect
from services.scheduler import faults
from services.scheduler.jobs import JobRecord

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore


@functools.cache
def finished_on(node: str) -> Status:
    """Every job finished on `node` has this status: one frozen object a node, not one a job
    (a million finished jobs would otherwise each hold their own)."""
    return Status(code=StatusCode.FINISHED, reason="completed", decided_by=node)


def on_finished(core: SchedulerCore, msg: JobFinished, now: float) -> list[Effect]:
    core.jobs.check_host(msg.job_id, msg.node_id)
    rec = core.jobs.running.get(msg.job_id)
    if rec is None:
        return _finished_while_requeued(core, msg, now)
    cause = causes.COMPLETED
    if rec.placement[0][0] != msg.node_id:
        # A run the job has since left (its stop still on the way) may have done all the
        # work: the job is done, as the placer takes it (it stops the run the job has now).
        # A partial or failed report from there is stale.
        if not _all_work_done(rec, msg):
            return []
        cause = causes.completed_on_left_node(msg.node_id)
    core.end_run(rec, msg.iterations_done, now)
    if msg.failure is not None:
        return faults.on_trainer_failed(core, rec, msg, now)
    rec.status = finished_on(msg.node_id)
    effects: list[Effect] = [core.transition(rec, JobState.FINISHED, cause, now)]
    return effects + core.request_cycle(now, "completion")


def _finished_while_requeued(core: SchedulerCore, msg: JobFinished, now: float
                             ) -> list[Effect]:
    """A node taken for lost may yet complete the job before it hears of the requeue, and a
    run taken for vanished may have completed with its report delayed: a report of all the
    work finishes the job (its agent would never start it again, and elsewhere it would train
    twice), backing off or not. Anything else is stale or a duplicate."""
    rec = core.jobs.get(msg.job_id)
    if rec is None or rec.state is not JobState.PREEMPTED or not _all_work_done(rec, msg):
        return []
    rec.iterations_done = msg.iterations_done
    rec.ended_at = now
    core.faults.backoff.pop(msg.job_id, None)  # its retry, if any, is called off
    if msg.job_id in core.views:  # backing off: out of sight already
        core.hide(msg.job_id)
    rec.status = finished_on(msg.node_id)
    return [core.transition(rec, JobState.FINISHED, causes.COMPLETED_WHILE_REQUEUED, now),
            *core.request_cycle(now, "completion")]


def on_status(core: SchedulerCore, msg: NodeStatus) -> list[Effect]:
    """A node's progress report (sent when it stops jobs) replaces the estimate."""
    for job_id in msg.progress:
        core.jobs.check_host(job_id, msg.node_id)
    if msg.node_id in core.faults.lost:
        return []  # its jobs have been requeued; what it says of them is stale
    for job_id, done in msg.progress.items():
        rec = core.jobs[job_id]
        if rec.state is not None and not rec.state.terminal:
            if rec.run is not None:  # running again (moved): its view stands till the next
                core.views.freeze(job_id)  # cycle, which the policy is told of (may rise)
                core.jobs.reported(job_id)
                rec.run.remaining = rec.spec.iterations - done
            rec.iterations_done = rec.reported = done
            rec.confirmed = rec.confirmed or rec.on_node(msg.node_id)
    return []


def _all_work_done(rec: JobRecord, msg: JobFinished) -> bool:
    """A report of the job's whole work, without failure: the job is done, whichever run
    (even one it has left) sent it."""
    return msg.failure is None and msg.iterations_done >= rec.spec.iterations
