"""What-if: the arrivals of a recorded run, simulated under another policy.

The recorded side is measured from the log itself (its transitions and plans, through the
metrics core every run uses); the what-if side is a fresh simulation of the same submissions,
at their recorded times, on the header's cluster with its overhead model and seed.
"""

from __future__ import annotations

from domain.overhead import parse_overhead
from loom.eventlog import EventLog, EventLogError
from loom.replay.cores import cluster_of, profile_of, tenants_of
from loom.replay.engine import recorded_envelope
from loom.simulate import SimConfig, SimResult, run_simulation
from schemas import subjects
from schemas.events import JobTransitionV1, PlanDecided
from schemas.job import JobSpec, SubmitJob
from services.metrics.core import MetricsCore
from services.runtime.bus import decode_submit, fallback_id


def arrivals(log: EventLog) -> list[JobSpec]:
    """The jobs submitted in the run, as the scheduler took them in (its admission or
    rejection carries the spec it built, with the time it received the submission); a log
    without them falls back to the submissions themselves."""
    jobs: dict[str, JobSpec] = {}
    for rec in log.records:
        if rec.subject == subjects.JOB_TRANSITION:
            env = recorded_envelope(rec)
            if env is not None and isinstance(env.body, JobTransitionV1) and env.body.spec:
                jobs.setdefault(env.body.job_id, env.body.spec)
    if jobs:
        return list(jobs.values())
    for rec in log.records:
        if rec.subject != subjects.JOB_SUBMIT:
            continue
        try:
            env = decode_submit(rec.data, fallback_id=fallback_id(rec.msg_id, rec.seq),
                                now=rec.time)
        except ValueError:
            continue  # dead-lettered in the run too
        if isinstance(env.body, SubmitJob):
            spec = env.body.to_spec(f"job-{env.event_id}", rec.time)
            jobs.setdefault(spec.job_id, spec)  # a re-sent submission counts once, as it did
    if not jobs:
        raise EventLogError(log.path, None, "no job submissions in the log: nothing to simulate")
    return list(jobs.values())


def recorded_summary(log: EventLog) -> dict[str, object]:
    """The recorded run's metrics, from its scheduler's transitions and plans."""
    metrics = MetricsCore(cluster_of(log).total_gpus, parse_overhead(log.run.overhead))
    for rec in log.records:
        env = recorded_envelope(rec)
        if env is not None and isinstance(env.body, (JobTransitionV1, PlanDecided)):
            metrics.handle(env, env.occurred_at)
    return {"policy": log.run.policy or "(recorded)", **metrics.summary()}


async def what_if(log: EventLog, policy: str, round_s: float | None = None) -> SimResult:
    """Simulate the log's arrivals under `policy` (its round length: `round_s`, else the
    recorded run's)."""
    run = log.run
    cfg = SimConfig(policy=policy, jobs=arrivals(log), cluster=cluster_of(log),
                    trace_name=run.trace, overhead=run.overhead,
                    round_s=round_s if round_s is not None else run.round_s,
                    placement=run.placement, seed=run.seed, profile=profile_of(log),
                    free_at_once=run.free_at_once, tenants=tenants_of(log))
    return await run_simulation(cfg)


ROWS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "d"), ("finished", "finished", "d"), ("rejected", "rejected", "d"),
    ("avg JCT (s)", "avg_jct_s", ",.0f"), ("p50 JCT (s)", "p50_jct_s", ",.0f"),
    ("p99 JCT (s)", "p99_jct_s", ",.0f"), ("makespan (s)", "makespan_s", ",.0f"),
    ("avg time to first start (s)", "avg_queueing_s", ",.0f"),
    ("avg time pending (s)", "avg_pending_s", ",.0f"), ("preemptions", "preemptions", "d"),
    ("deadline ratio", "deadline_ratio", ".3f"), ("GPU utilisation", "gpu_util", ".3f"),
)


def comparison_rows(recorded: dict[str, object],
                    whatif: dict[str, object]) -> list[tuple[str, str, str]]:
    """(metric, recorded, what-if) as text; rows neither side has are left out."""
    out = []
    for label, key, fmt in ROWS:
        a, b = recorded.get(key), whatif.get(key)
        if a is None and b is None:
            continue
        out.append((label, _fmt(a, fmt), _fmt(b, fmt)))
    return out


def _fmt(value: object, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return format(value, fmt) if fmt != "d" else f"{int(value):,}"
    return str(value)
