"""Builds per-job outcomes and run statistics from the scheduler's published decisions.

It sees only the bus, so its `decision_digest` proves that two runs (or two buses) carried the
same decisions: a SHA-256 over every scheduler-produced event body, in order.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from domain.causes import RECLAIMED
from domain.overhead import OverheadModel
from schemas import subjects
from schemas.events import Envelope, JobTransitionV1, NodeHeartbeat, PlanDecided, StartForecast
from schemas.job import TERMINAL_STATES, WAITING_STATES, JobSpec, JobState
from schemas.queue_status import QueueStatus
from services.metrics.forecasts import ForecastScores
from services.metrics.outcomes import JobOutcome, percentile
from services.metrics.queues import QueueBoard
from services.metrics.usage_series import UsageSeries
from services.runtime.effects import Effect
from services.runtime.service import CoreDefaults, Subscribe

# The states as module constants (tested with WAITING_STATES and TERMINAL_STATES, not the
# enum's properties): these run on every transition, where `JobState.X` (a lookup through the
# enum's metaclass) and those properties cost several times a global's lookup.
_QUEUED, _RUNNING, _PREEMPTED = JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED
_FINISHED, _FAILED, _REJECTED = JobState.FINISHED, JobState.FAILED, JobState.REJECTED


# The decision log behind `decision_digest`: one canonical line per decision. Floats use repr
# (shortest round-trip form), so equal values give equal lines on every bus and machine.
def transition_record(t: JobTransitionV1, at: float) -> str:
    # Joined, not formatted: a state is a str (a StrEnum), which `join` reads as it is, where
    # formatting it, or hashing it to look its text up, runs the enum's Python code.
    previous = t.previous
    return " ".join(("T", repr(at), t.job_id, "None" if previous is None else previous, t.state,
                     t.cause, str(t.gpus), repr(t.placement), repr(t.iterations_done) + "\n"))


def plan_record(p: PlanDecided, at: float) -> str:
    launches = " ".join([x.job_id + "@" + repr(x.placement) + ":" + repr(x.iterations_done)
                         for x in p.launches])
    stops = " ".join([x.job_id + ":" + x.reason for x in p.stops])
    return "".join(("P ", repr(at), " ", str(p.cycle), " [", launches, "] [", stops, "] ",
                    str(p.running), " ", str(p.busy_gpus), "\n"))


def _rejection_code(t: JobTransitionV1) -> str:
    """What kind of rejection this is: its status code (`rejected_too_large`, ...)."""
    return t.status.code.value if t.status is not None else "rejected"


class MetricsCore(CoreDefaults):
    name = "metrics"

    def __init__(self, total_gpus: int, overhead: OverheadModel | None = None) -> None:
        self.total_gpus = total_gpus
        # The run's restart cost model (a simulation's); None: restarts cost what they take,
        # which a live run's JCT shows but no model here can count.
        self.overhead = overhead if overhead is not None and overhead.charges_restart else None
        self._specs: dict[str, JobSpec] = {}  # live jobs, with such a model: restarts' costs
        self.jobs: dict[str, JobOutcome] = {}
        self._digest = hashlib.sha256()
        self.decisions = 0
        # GPU → how many running jobs hold it (interleaved jobs share GPUs; count a GPU once).
        # A plain dict: a Counter's update and deletions run Python code for each GPU.
        self._holders: dict[tuple[str, int], int] = {}
        self._placement: dict[str, list[tuple[str, int]]] = {}
        self._busy_since = 0.0
        self.busy_gpu_s = 0.0
        self.usage = UsageSeries()  # busy GPU-seconds over time (utilisation plots)
        self.first_submit: float | None = None
        # ∫ (active jobs) dt, for each job's average contention (finish-time fairness)
        self._active = 0
        self._active_area = 0.0
        self._active_since = 0.0
        self._area_at_admit: dict[str, tuple[float, float]] = {}
        self.last_end = 0.0
        self.finished = 0
        self.failed = 0
        self.rejected = 0
        # Why jobs were rejected: the admission status code (too large, invalid, quota, ...).
        self.rejected_by: Counter[str] = Counter()
        self.interleaved = 0  # launches onto GPUs shared with other jobs (Muri groups)
        self._held_since: dict[str, tuple[float, int]] = {}  # running job → (since, GPUs)
        self.reclaims = 0  # preemptions by a queue taking back its quota (docs/queues.md)
        self.reclaim_gpu_s = 0.0  # their GPUs × time since the run's last checkpoint
        self.awaited: set[str] = set()  # jobs a run waits for (Gavel's jobs_to_complete)
        self.heartbeats: dict[str, tuple[float, NodeHeartbeat]] = {}  # node → latest (live)
        self.faults: Counter[str] = Counter()  # by schemas.causes.FaultKind
        self.forecasts = ForecastScores()  # start forecasts against the starts that followed
        self.queues = QueueBoard()  # the queues' latest status (live schedulers publish it)

    def subscriptions(self) -> Sequence[Subscribe]:
        return (Subscribe(subjects.JOB_TRANSITION), Subscribe(subjects.PLAN_DECIDED),
                Subscribe(subjects.NODE_HEARTBEAT), Subscribe(subjects.START_FORECAST),
                Subscribe(subjects.QUEUE_STATUS))

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        body = env.body
        # Decisions first: nearly every message is one, most of them transitions.
        if isinstance(body, JobTransitionV1):  # either version
            self.decisions += 1
            at = env.occurred_at
            self._digest.update(transition_record(body, at).encode())
            self._on_transition(body, at)
        elif isinstance(body, PlanDecided):
            self.decisions += 1
            self._digest.update(plan_record(body, env.occurred_at).encode())
            for launch in body.launches:
                if len(launch.colocated) > 1:
                    self.interleaved += 1
        elif isinstance(body, NodeHeartbeat):  # telemetry, not a decision: outside the digest
            self.heartbeats[body.node_id] = (env.occurred_at, body)
        elif isinstance(body, StartForecast):  # an observation too: outside the digest
            self.forecasts.forecast(body)
        elif isinstance(body, QueueStatus):  # likewise
            self.queues.status(body)
        else:
            self.decisions += 1  # counted, as any message not an observation
            raise TypeError(f"metrics does not handle {env.type}")
        return []

    def busy_gpus(self) -> list[tuple[str, int]]:
        """(node, GPU index) of every GPU running jobs hold now."""
        return list(self._holders)

    def utilisation_over_time(self, end: float) -> list[tuple[float, float]]:
        """(bin start, fraction of the cluster's GPUs busy) from the first launch to `end`, at
        most `UsageSeries.max_bins` points; GPUs still held count up to `end`."""
        usage = self.usage
        if self._holders and end > self._busy_since:
            usage = usage.copy()
            usage.add(self._busy_since, end, len(self._holders))
        return usage.utilisation(self.total_gpus, end)

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()

    def _contend(self, delta: int, at: float) -> float:
        """Add `delta` active jobs at `at`; returns ∫ active dt up to `at` (before the change)."""
        self._active_area += self._active * (at - self._active_since)
        self._active_since = at
        area = self._active_area
        self._active += delta
        return area

    def _occupy(self, job_id: str, gpus: list[tuple[str, int]] | None, at: float) -> None:
        """Job now holds `gpus` (None: nothing); integrates busy GPUs up to `at` first."""
        holders = self._holders
        busy, since = len(holders), self._busy_since
        self.busy_gpu_s += busy * (at - since)
        self.usage.add(since, at, busy)
        self._busy_since = at
        for gpu in self._placement.pop(job_id, ()):
            held = holders[gpu]  # ≥ 1: each GPU of a placement counts in `holders`
            if held == 1:
                del holders[gpu]
            else:
                holders[gpu] = held - 1
        if gpus:
            self._placement[job_id] = gpus
            for gpu in gpus:
                holders[gpu] = holders.get(gpu, 0) + 1

    def _on_transition(self, t: JobTransitionV1, at: float) -> None:
        job_id, state, previous = t.job_id, t.state, t.previous
        out = self.jobs.get(job_id)
        if out is None:
            out = self._admit(t, at)
            if out is None:
                return
        waiting_since = out.waiting_since
        if waiting_since is not None:
            if state not in WAITING_STATES:
                out.pending_s += at - waiting_since
                out.waiting_since = None
        elif state in WAITING_STATES:
            out.waiting_since = at
        if previous is _RUNNING:
            run = self._held_since.pop(job_id, None)
            if run is not None:
                since, held = run
                gpu_s = held * (at - since)
                out.gpu_s += gpu_s
                if state is _PREEMPTED:
                    # The run's work since its last checkpoint (its start: the scheduler hears
                    # of no other) is what the preemption can cost.
                    out.lost_gpu_s += gpu_s
                    if t.why().text.startswith(RECLAIMED):  # a queue took its lent quota back
                        self.reclaims += 1
                        self.reclaim_gpu_s += gpu_s
                        out.reclaim_lost_gpu_s += gpu_s
                        self.queues.reclaimed(out.tenant)
        if state is _RUNNING:
            gpus = [(node, i) for node, idx in t.placement for i in idx]
            if previous is _PREEMPTED and self.overhead is not None:
                width = len(gpus) or out.gpus
                out.lost_gpu_s += width * self.overhead.restart(self._specs[job_id], width)
            self._held_since[job_id] = (at, len(gpus) or out.gpus)
            # A transition without a placement (hand-made, or older producers) still counts.
            self._occupy(job_id, gpus or [(f"job:{job_id}", i) for i in range(out.gpus)], at)
            if out.start_s is None:
                out.start_s = at
            self.forecasts.started(job_id, at)
        else:
            if previous is _RUNNING:
                self._occupy(job_id, None, at)
            if state is _PREEMPTED:
                out.preemptions += 1
                self._fault(t)
            elif state in TERMINAL_STATES:
                self._leave(t, out, at)
        out.state = state
        out.cause = t.cause

    def _admit(self, t: JobTransitionV1, at: float) -> JobOutcome | None:
        """The job's first transition: its outcome record (None: rejected without a spec)."""
        spec = t.spec
        if spec is None:  # rejected before it had a valid spec
            self.rejected += 1
            self.rejected_by[_rejection_code(t)] += 1
            return None
        out = JobOutcome(t.job_id, spec.tenant, spec.model, spec.gpus, spec.submit_time_s,
                         spec.deadline_s, spec.best_effort, t.state, work_s=spec.work_s,
                         total_gpus=self.total_gpus)
        self.jobs[t.job_id] = out
        if self.overhead is not None:
            self._specs[t.job_id] = spec
        if t.state in WAITING_STATES:  # its wait began when it was submitted
            out.waiting_since = min(spec.submit_time_s, at)
        if t.state is _QUEUED:
            self._area_at_admit[t.job_id] = (at, self._contend(+1, at))
        if self.first_submit is None or spec.submit_time_s < self.first_submit:
            self.first_submit = spec.submit_time_s
        return out

    def _fault(self, t: JobTransitionV1) -> None:
        """Counts the fault behind a preemption or failure, if one was."""
        fault = t.why().fault
        if fault is not None:
            self.faults[fault] += 1

    def _leave(self, t: JobTransitionV1, out: JobOutcome, at: float) -> None:
        """The job finished, failed or was rejected: it is no longer active."""
        job_id, state = t.job_id, t.state
        if state is _FAILED:
            self._fault(t)
        self.forecasts.dropped(job_id)
        self._specs.pop(job_id, None)  # it restarts no more
        admit = self._area_at_admit.pop(job_id, None)
        if admit is not None:
            admitted, area = admit
            now_area = self._contend(-1, at)
            if at > admitted:
                out.contention = max(1.0, (now_area - area) / (at - admitted))
        if state is _REJECTED:
            self.rejected += 1
            self.rejected_by[_rejection_code(t)] += 1
            return
        # Finished, or failed: it left the cluster then, so a failed job's GPU time counts in
        # the run's span (makespan, util) too.
        out.end_s = at
        if state is _FINISHED:
            self.finished += 1
        else:
            self.failed += 1
        self.awaited.discard(job_id)  # nothing left to wait for
        self.last_end = max(self.last_end, at)

    def state(self, now: float) -> dict[str, Any]:
        return {"now": now, "summary": self.summary()}

    def summary(self) -> dict[str, object]:
        jcts = sorted(j.jct_s for j in self.jobs.values() if j.jct_s is not None)
        waits = [j.queueing_s for j in self.jobs.values() if j.queueing_s is not None]
        pending = [j.pending_s for j in self.jobs.values() if j.state is JobState.FINISHED]
        deadline_jobs = [j for j in self.jobs.values() if j.met_deadline is not None]
        declined = sum(1 for j in deadline_jobs if j.state is JobState.REJECTED)
        best_effort = [j.jct_s for j in self.jobs.values() if j.best_effort and j.jct_s is not None]
        rhos = [r for j in self.jobs.values() if (r := j.ftf_rho) is not None]
        span = self.last_end - (self.first_submit or 0.0)
        util = self.busy_gpu_s / (self.total_gpus * span) if span > 0 else 0.0
        return {
            "jobs": len(self.jobs),
            "finished": self.finished,
            "failed": self.failed,
            "rejected": self.rejected,
            "rejected_by": dict(sorted(self.rejected_by.items())),
            "avg_jct_s": sum(jcts) / len(jcts) if jcts else None,
            "p50_jct_s": percentile(jcts, 0.5) if jcts else None,
            "p99_jct_s": percentile(jcts, 0.99) if jcts else None,
            "makespan_s": self.last_end if jcts else None,
            # Time to first start (submission to first launch), over the jobs that started;
            # `avg_queueing_s` is its older name, kept for the readers of earlier summaries.
            "avg_first_start_s": sum(waits) / len(waits) if waits else None,
            "avg_queueing_s": sum(waits) / len(waits) if waits else None,
            # Every wait, before the first start and after each preemption, over finished jobs.
            "avg_pending_s": sum(pending) / len(pending) if pending else None,
            "preemptions": sum(j.preemptions for j in self.jobs.values()),
            # Of those, by queues reclaiming lent quota, and the GPU-hours of work they put at
            # risk: each victim's GPUs × its run since its last checkpoint (taken as the run's
            # start; Loom's trainer checkpoints on the stop, so an upper bound).
            "reclaims": self.reclaims,
            "reclaim_lost_gpu_h": self.reclaim_gpu_s / 3600.0,
            # Every preemption's such work, and each resumption's restart overhead (the run's
            # overhead model: a simulation's; none on a live cluster), per tenant below too.
            "preemption_lost_gpu_h": sum(j.lost_gpu_s for j in self.jobs.values()) / 3600.0,
            # Failures a trace records that the run replayed (`loom sim --replay-failures`):
            # restarts, and last runs that failed for good.
            "failures_replayed": self.faults["recorded-failure"],
            "interleaved_launches": self.interleaved,
            "ftf_rho_mean": sum(rhos) / len(rhos) if rhos else None,
            "ftf_rho_max": max(rhos) if rhos else None,
            # ElasticFlow's measure: met / all deadline jobs; best-effort jobs are left out, a job
            # declined at admission or finished late counts as missed.
            "deadline_ratio": (
                sum(1 for j in deadline_jobs if j.met_deadline) / len(deadline_jobs)
                if deadline_jobs else None
            ),
            "deadline_jobs": len(deadline_jobs),
            "deadline_met": sum(1 for j in deadline_jobs if j.met_deadline),
            # Deadline jobs admitted (not declined). Chronus declines none: the jobs it does
            # not guarantee still run on spare GPUs, so here they count as accepted.
            "accepted": len(deadline_jobs) - declined,
            "declined": declined,  # deadline jobs refused at admission
            "best_effort_avg_jct_s": sum(best_effort) / len(best_effort) if best_effort else None,
            "gpu_util": util,
            "tenants": self.tenants(span),
            # |forecast - actual start| of the scheduler's start forecasts (None: none made;
            # services.metrics.forecasts says which forecasts count).
            "forecast_error_s": self.forecasts.summary(),
            "decision_digest": self.digest,
        }

    def tenants(self, span: float) -> dict[str, dict[str, object]]:
        """Per tenant: jobs, finished, rejected, average JCT, GPU-seconds held and the average
        GPUs held over the run (GPU-seconds / span)."""
        by_tenant: dict[str, list[JobOutcome]] = {}
        for job in self.jobs.values():
            by_tenant.setdefault(job.tenant, []).append(job)
        out: dict[str, dict[str, object]] = {}
        for tenant in sorted(by_tenant):
            mine = by_tenant[tenant]
            jcts = [jct for j in mine if (jct := j.jct_s) is not None]
            gpu_s = sum(j.gpu_s for j in mine)
            out[tenant] = {
                "jobs": len(mine),
                "finished": sum(1 for j in mine if j.state is JobState.FINISHED),
                "rejected": sum(1 for j in mine if j.state is JobState.REJECTED),
                "avg_jct_s": sum(jcts) / len(jcts) if jcts else None,
                "gpu_s": gpu_s,
                "avg_gpus": gpu_s / span if span > 0 else 0.0,
                "preemption_lost_gpu_h": sum(j.lost_gpu_s for j in mine) / 3600.0,
                "reclaim_lost_gpu_h": sum(j.reclaim_lost_gpu_s for j in mine) / 3600.0,
            }
        return out
