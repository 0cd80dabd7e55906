"""Submissions: a job is admitted (queued, in the policy's sight) or refused with a reason
naming what is wrong; a job id is taken once."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from pydantic import ValidationError

from domain import causes
from policies.mechanisms.admission import submit_refusal
from schemas import subjects
from schemas.events import JobTransition
from schemas.job import JobSpec, JobState, SubmitJob, valid_job_id
from schemas.status import Status, StatusCode
from schemas.userinput import explain
from services.runtime.effects import Effect, Publish

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore


# A live cluster's trainers fail when they fail: no node agent can make one fail on cue.
NO_REPLAY = ("fail_at: a live cluster cannot replay recorded failures (its trainers cannot "
             "fail on cue); fail_at is for simulations (loom sim --replay-failures)")


def on_submit(core: SchedulerCore, sub: SubmitJob, event_id: str, now: float) -> list[Effect]:
    job_id = sub.job_id or _unnamed_id(event_id)
    if job_id in core.jobs:
        _check_resubmission(core, job_id, sub)
        return []  # the same job again (a retried submit, a re-delivery): handled once
    try:
        spec = sub.to_spec(job_id, now)
    except ValidationError as exc:  # a submission built in-process, without validation
        msg = explain(exc, JobSpec.model_fields)
        return _reject(core, job_id, None, StatusCode.REJECTED_INVALID, msg, now)
    refusal = _refusal(core, spec)
    if refusal is not None:
        return _reject(core, job_id, spec, *refusal, now)
    rec = core.jobs.add(spec, now)
    effects: list[Effect] = [
        core.transition(rec, JobState.QUEUED, causes.ADMITTED, now, with_spec=True)]
    core.show(rec)
    return effects + core.request_cycle(now, "arrival")


def _unnamed_id(event_id: str) -> str:
    """The id of a job submitted without one: from its message id, which its sender chose
    (`nats pub` sets any Nats-Msg-Id); one that cannot name a job (a space, a slash, too
    long) is hashed into one that can, so the job is taken rather than lost."""
    try:
        return valid_job_id(f"job-{event_id}")
    except ValueError:
        return f"job-{hashlib.sha256(event_id.encode()).hexdigest()[:24]}"


def _refusal(core: SchedulerCore, spec: JobSpec) -> tuple[StatusCode, str] | None:
    """Why the job can never run here (too large, a policy's or a quota's no, a recorded
    failure no node here can replay), or None."""
    if spec.fail_at is not None and not core.config.replays_failures:
        return StatusCode.REJECTED_INVALID, NO_REPLAY
    total = core.cluster.total_gpus
    if spec.gpus > total:
        return StatusCode.REJECTED_TOO_LARGE, f"needs {spec.gpus} GPUs; the cluster has {total}"
    if spec.gpu_type is not None and spec.gpu_type not in core.gpu_types:
        return StatusCode.REJECTED_TOO_LARGE, (
            f"GPU type {spec.gpu_type!r} not in cluster ({', '.join(sorted(core.gpu_types))})")
    refusal = core.policy.admit(spec)
    if refusal is not None:
        return StatusCode.REJECTED_BY_POLICY, refusal
    if core.config.tenants is not None:
        refusal = submit_refusal(core.config.tenants, spec, core.jobs.waiting(spec.tenant))
        if refusal is not None:
            return StatusCode.REJECTED_BY_QUOTA, refusal
    return None


def _check_resubmission(core: SchedulerCore, job_id: str, sub: SubmitJob) -> None:
    """A submission under a taken id is accepted, once, only if it is the same job: a
    different one raises, so the shell dead-letters it with the reason (it would otherwise
    vanish without a word, and its submitter wait for a job never queued)."""
    known = core.jobs[job_id].spec
    try:
        same = sub.to_spec(job_id, known.submit_time_s) == known
    except ValidationError:
        same = False
    if not same:
        raise ValueError(f"duplicate job id {job_id!r}: a different job was submitted "
                         "under it; submit with another id (or none, to get one)")


def _reject(core: SchedulerCore, job_id: str, spec: JobSpec | None, code: StatusCode,
            reason: str, now: float) -> list[Effect]:
    status = Status(code=code, reason=reason, decided_by="admission")
    cause = causes.rejected(reason)
    if spec is None:
        # Keep a record so the rejection is visible, with a placeholder spec.
        return [Publish(subjects.JOB_TRANSITION, JobTransition(
            job_id=job_id, state=JobState.REJECTED, previous=None, cause=cause.text,
            reason=cause, status=status))]
    rec = core.jobs.add(spec, now, status)
    return [core.transition(rec, JobState.REJECTED, cause, now, with_spec=True)]
