"""What people and tools ask the scheduler: why a job is where it is, and the rows and
figures `loom status` shows (read from a running scheduler's `state` endpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from schemas.job import JobState
from schemas.status import Status, StatusCode
from services.scheduler import forecasting
from services.scheduler.liveness import OPERATOR

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore


def status(core: SchedulerCore, job_id: str) -> Status:
    """Why a job is where it is ("why is my job pending")."""
    rec = core.jobs[job_id]
    if job_id in core.jobs.held:
        return Status(code=StatusCode.SUSPENDED, reason="suspended by an operator",
                      decided_by="operator")
    backoff = core.faults.backoff.get(job_id)
    if backoff is not None:
        return Status(code=StatusCode.WAITING_BY_POLICY, reason=(
            f"trainer failed {core.faults.failures[job_id]} time(s); retrying at "
            f"{backoff:g}"), decided_by="retry")
    if rec.state is not None and rec.state.waiting:
        waiting = core.policy.waiting_status(job_id)
        held = None if core.tenancy is None else core.tenancy.status_for(job_id, rec.spec)
        if held is not None:
            waiting = held.model_copy(update={"queue_position": waiting.queue_position})
        start = forecasting.expected_start(core, job_id)
        if start is not None:
            waiting = waiting.model_copy(update={"forecast_start_s": start})
        return waiting
    if rec.state is JobState.RUNNING:  # derived on demand: cheaper than one per launch
        assert rec.last is not None
        return Status(code=StatusCode.RUNNING, reason=rec.last.cause.text,
                      decided_by=core.policy.name)
    assert rec.status is not None
    return rec.status


def state(core: SchedulerCore, now: float) -> dict[str, Any]:
    """The scheduler's state as `loom status` reads it, with a fresh forecast of waiting
    jobs' starts where the latest is stale (`forecasting.on_request`)."""
    latest = forecasting.on_request(core, now)
    faults = core.faults
    cordons = {node: dict(faults.cordons.get(node) or {OPERATOR: "drained"})
               for node in sorted(core.drained)}
    return {"now": now, "policy": core.policy.name, "cycle": core.cycle,
            "nodes": [n.node_id for n in core.cluster.nodes],
            # Drained by an operator; `cordoned` has every node taking no new work, with
            # who cordoned it and why (an operator, its health checks).
            "drained": [n for n, by in cordons.items() if OPERATOR in by],
            "cordoned": cordons,
            "gpus_out": {node: {str(g): why for g, why in sorted(gpus.items())}
                         for node, gpus in sorted(faults.gpus_out.items())},
            "health_warnings": dict(sorted(faults.warnings.items())),
            "lost": sorted(faults.lost),
            "suspended": sorted(core.jobs.held),
            # Forecasts of waiting jobs' starts (None: off): when the latest was made.
            "forecast": None if core.config.forecast_every_s is None else {
                "at": None if latest is None else latest.at,
                "every_s": core.config.forecast_every_s},
            "jobs": [job_row(core, jid, now) for jid in core.jobs]}


def job_row(core: SchedulerCore, job_id: str, now: float) -> dict[str, Any]:
    """One job's row: where it is and why, its progress and, while it runs, when it should
    finish (the scheduler's own estimate since the last report, as the policies see it);
    while it waits, when it should start (the latest forecast, where forecasts are on)."""
    rec = core.jobs[job_id]
    why = status(core, job_id)
    done, eta = rec.iterations_done, None
    if rec.state is JobState.RUNNING and rec.run is not None and rec.run.iteration_s > 0:
        left = max(0.0, rec.run.left_at(now))
        done = rec.spec.iterations - left
        eta = rec.run.finish_at(now)
    return {"job_id": job_id, "state": rec.state.value if rec.state else "rejected",
            "code": why.code.value, "reason": why.reason, "queue_position": why.queue_position,
            "forecast_start_s": why.forecast_start_s,
            "gpus": rec.spec.gpus, "nodes": sorted({n for n, _ in rec.placement}),
            "iterations": rec.spec.iterations,
            "done": round(done, 1), "eta": eta, "tenant": rec.spec.tenant,
            "model": rec.spec.model}
