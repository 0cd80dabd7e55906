"""Chronus (SoCC'21), lease-based deadline scheduling, as ElasticFlow's artifact runs it.

Time is cut into lease terms (`--round-s`, the artifact's 240 s); at every term boundary the
policy updates its accepted jobs' remaining terms, lets the lease MILP (`policies.chronus.milp`)
choose which accepted jobs run this term, admits the jobs that arrived if they pack before
their deadlines (`policies.chronus.packing`), and hands the spare GPUs to every job not
accepted. Jobs are rigid. The whole explanation, the MILP and what is not reproduced:
docs/policies/chronus.md.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from policies.base import Fitter, JobView, Plan, Policy, Snapshot
from policies.chronus.lease import LeaseProblem, Selection
from policies.chronus.milp import LeaseSolver
from policies.chronus.packing import Item, earliest_limit, packable, unpack
from policies.mechanisms.lp import as_summary
from policies.mechanisms.walk import place_runnable
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable

PADDING = 1.1  # the artifact pads every estimate by 10 %
CHECKPOINT_S, RESUME_S = 0.1, 0.4  # CHECKPOINT_OVER_HEAD, RESUME_OVER_HEAD (per GPU level)
TOLERATE_RATIO = 1.0


class Tier(enum.IntEnum):
    """The artifact's `queue_priority`."""

    LOWEST = -1  # its deadline cannot be met any more
    ACCEPTED = 0  # guaranteed by the lease plan
    UNACCEPTED = 1  # an SLO job the plan could not take: runs on spare GPUs
    BEST_EFFORT = 2


def bin_gpus(gpus: int) -> int:
    """GPUs a job takes in the lease plan (the artifact's `convert_to_bin`)."""
    if gpus > 8:
        return gpus
    if gpus in (5, 6, 7):
        return 8
    if gpus in (3, 4):
        return 4
    return gpus


def estimate_s(work_s: float, gpus: int, lease_s: float) -> int:
    """The artifact's `estimate_duration`: run time padded for checkpoint/resume and by 10 %."""
    coef = 1 + (1 + math.log2(gpus)) * (RESUME_S + CHECKPOINT_S) / lease_s
    return int(work_s * coef * PADDING)


def leases_for(seconds: float, lease_s: float) -> int:
    """Terms needed to run `seconds` more (⌈seconds / lease⌉, at least 0)."""
    return max(0, math.ceil(seconds / lease_s - 1e-9))


def term_index(t: float, lease_s: float) -> int:
    """The term containing time t (terms start at multiples of lease_s)."""
    return math.floor(t / lease_s + 1e-9)


@dataclass(slots=True)
class _Job:
    tier: Tier
    estimate_s: int
    leases_left: int = 0
    end_term: int = 0  # an accepted job runs in terms before this one (absolute index)
    deadline_s: float = math.inf  # the deadline it is held to (an accepted job's: term-aligned)
    forced: bool = False  # ran its whole estimate: first on spare GPUs
    new: bool = True  # not yet through admission


class Chronus(Policy):
    name = "chronus"
    description = "Chronus: lease terms, a MILP picks the deadline jobs, spare GPUs best-effort"
    placement = "count"
    replan = "round"

    def __init__(self, *, lease_s: float = 240.0, horizon: int = 16,
                 time_limit_s: float = 60.0, node_limit: int = 2000,
                 tolerance: float = TOLERATE_RATIO) -> None:
        self.lease_s = lease_s
        self.tolerance = tolerance
        self.solver = LeaseSolver(horizon=horizon, time_limit_s=time_limit_s,
                                  node_limit=node_limit)
        self.jobs: dict[str, _Job] = {}
        self.accepted = 0
        self.unaccepted = 0
        self._unaccepted_seen = 0  # the artifact's `number_of_accepted` (sic): objective sign
        self._last: Plan | None = None
        self._position: dict[str, int] = {}

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        self.lease_s = round_s

    def job_added(self, job: JobView) -> None:
        spec = job.spec
        slo = spec.deadline_s is not None and not spec.best_effort
        work = spec.iterations * spec.iteration_time_at(spec.gpus)
        self.jobs[job.job_id] = _Job(Tier.ACCEPTED if slo else Tier.BEST_EFFORT,
                                     estimate_s(work, spec.gpus, self.lease_s))

    def job_removed(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self._position.pop(job_id, None)

    # -- a term ----------------------------------------------------------------------------
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        lease = self.lease_s
        term = term_index(snap.now, lease)
        views = [v for v in snap.jobs.values() if v.job_id in self.jobs]

        # 1. bookkeeping of accepted jobs (the artifact's flush_running_jobs / lease update)
        for v in views:
            rec = self.jobs[v.job_id]
            if rec.new or rec.tier is not Tier.ACCEPTED:
                continue
            done_s = v.iterations_done * v.spec.iteration_time_at(v.spec.gpus)
            rec.leases_left = min(rec.leases_left, leases_for(rec.estimate_s - done_s, lease))
            if v.attained_s >= rec.estimate_s or rec.leases_left <= 0:
                rec.tier, rec.forced = Tier.UNACCEPTED, True

        # 2. lease selection among accepted jobs
        planned = [v for v in views
                   if not self.jobs[v.job_id].new and self.jobs[v.job_id].tier is Tier.ACCEPTED]
        problem = LeaseProblem(
            gpus=tuple(bin_gpus(v.spec.gpus) for v in planned),
            required=tuple(self.jobs[v.job_id].leases_left for v in planned),
            deadline=tuple(self.jobs[v.job_id].end_term - term for v in planned),
            capacity=snap.cluster.total_gpus,
            spare_now=self._unaccepted_seen > 0,
        )
        sel = self.solver.select(problem)
        selected: list[JobView] = []
        for i, v in enumerate(planned):
            rec = self.jobs[v.job_id]
            if not sel.chosen[i]:
                rec.tier = Tier.UNACCEPTED
            elif sel.run_now[i]:
                selected.append(v)
                rec.leases_left -= 1
        self._unaccepted_seen = sum(1 for v in views
                                    if self.jobs[v.job_id].tier is Tier.UNACCEPTED)

        # 3. admission of the jobs that arrived since the last term
        arrivals = [v for v in views if self.jobs[v.job_id].new]
        if arrivals:
            self._admit(arrivals, problem, sel, term, snap.cluster.total_gpus)

        # 4. spare GPUs for everything not accepted
        picked = {v.job_id for v in selected}
        spot: list[JobView] = []
        for v in views:
            rec = self.jobs[v.job_id]
            if v.job_id in picked:
                continue
            remaining_s = v.remaining_iterations * v.spec.iteration_time_at(v.spec.gpus)
            if (rec.tier in (Tier.ACCEPTED, Tier.UNACCEPTED)
                    and rec.deadline_s < snap.now + remaining_s):
                rec.tier = Tier.LOWEST
            if rec.tier is not Tier.ACCEPTED:
                spot.append(v)
        spot.sort(key=lambda v: self._spot_key(v, snap.now))
        return self._place(selected, spot, fit)

    def _admit(self, arrivals: list[JobView], problem: LeaseProblem, sel: Selection,
               term: int, capacity: int) -> None:
        lease = self.lease_s
        free = np.full(max([*problem.deadline, 1]), capacity, dtype=np.int64)
        for i, terms in enumerate(unpack(problem, sel)):
            free[terms] -= problem.gpus[i]
        free = np.maximum(free[1:], 0)  # from the next term on (this one is decided)
        batch: list[Item] = []
        for v in arrivals:
            rec = self.jobs[v.job_id]
            rec.new = False
            if rec.tier is Tier.BEST_EFFORT:
                continue
            deadline = v.spec.deadline_s if v.spec.deadline_s is not None else math.inf
            rec.leases_left = leases_for(rec.estimate_s, lease)
            limit = term_index(deadline, lease) - (term + 1)
            item = (bin_gpus(v.spec.gpus), rec.leases_left, limit)
            fits_cluster = item[0] <= capacity
            ok = fits_cluster and packable(free, [*batch, item], capacity)
            if not ok and fits_cluster:
                later = earliest_limit(free, batch, item, capacity)
                relative = deadline - v.spec.submit_time_s
                promised = lease * (later + term + 1) - v.spec.submit_time_s
                if promised <= relative * self.tolerance:
                    ok, limit = True, later
                    item = (item[0], item[1], limit)
            if ok:
                rec.tier = Tier.ACCEPTED
                rec.end_term = term + 1 + limit
                rec.deadline_s = lease * rec.end_term
                batch.append(item)
                self.accepted += 1
            else:
                rec.tier = Tier.UNACCEPTED
                rec.deadline_s = deadline
                self._unaccepted_seen += 1
                self.unaccepted += 1

    def _spot_key(self, v: JobView, now: float) -> tuple[int, int, float, float, str]:
        rec = self.jobs[v.job_id]
        done_s = v.iterations_done * v.spec.iteration_time_at(v.spec.gpus)
        if rec.tier is Tier.LOWEST:
            urgency = -(rec.deadline_s - now - rec.estimate_s + done_s) * v.spec.gpus
        else:
            urgency = -(rec.estimate_s - done_s) * v.spec.gpus
        return (0 if rec.forced else 1, 1 if rec.tier is Tier.LOWEST else 0, -urgency,
                v.spec.submit_time_s, v.job_id)

    def _place(self, selected: list[JobView], spot: list[JobView], fit: Fitter) -> Plan:
        plan = Plan()
        # lease jobs, larger first as the artifact places them
        for v in sorted(selected, key=lambda v: -v.spec.gpus):
            slots = place_runnable(fit, v.spec, v.spec.gpus)
            if slots is None:  # a topology-aware placer may refuse; the term is not used
                self.jobs[v.job_id].leases_left += 1
                plan.blocked[v.job_id] = Status(
                    code=StatusCode.WAITING_FOR_CONSOLIDATED_GPUS, reason=fit.explain(
                        v.spec.gpus), decided_by=self.name)
                continue
            plan.run[v.job_id] = slots
        waiting: list[str] = []
        for v in spot:
            g = v.spec.gpus
            slots = place_runnable(fit, v.spec, g) if g <= fit.free_gpus else None
            if slots is None:
                waiting.append(v.job_id)
                continue
            plan.run[v.job_id] = slots
        self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        plan.free_gpus = fit.free_gpus
        self._last = plan
        return plan

    def solver_stats(self) -> dict[str, float | int]:
        return as_summary(self.solver.stats)

    def waiting_status(self, job_id: str) -> Status:
        rec = self.jobs.get(job_id)
        if self._last is not None and job_id in self._last.blocked:
            return self._last.blocked[job_id]
        if rec is None or rec.new:
            return Status(code=StatusCode.WAITING_BY_POLICY, decided_by=self.name,
                          reason="admission at the next lease term")
        if rec.tier is Tier.ACCEPTED:
            return Status(code=StatusCode.WAITING_BY_POLICY, decided_by=self.name,
                          reason="deadline guaranteed; the lease plan runs it in a later term")
        reason = {
            Tier.UNACCEPTED: "deadline not guaranteed; waits for spare GPUs",
            Tier.BEST_EFFORT: "best-effort; waits for spare GPUs",
            Tier.LOWEST: "its deadline can no longer be met; lowest priority on spare GPUs",
        }[rec.tier]
        return Status(code=StatusCode.WAITING_FOR_PRIORITY, reason=reason, decided_by=self.name,
                      queue_position=self._position.get(job_id))
