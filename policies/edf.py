"""Earliest deadline first, as ElasticFlow's artifact runs it (`edf_sim_allocation`).

Every cycle (slotted, 60 s by default), the active jobs are taken in deadline order
(best-effort jobs, without a deadline, last; ties by submission). Each takes its base quota,
min(largest GPU count it can use, cluster GPUs), when that many GPUs are free; otherwise the
largest GPU count of its profile that the free GPUs allow; otherwise it waits. Elastic jobs
thus shrink and grow from cycle to cycle; a job without a scaling profile runs at its requested
size or not at all. No admission control: late jobs run on and count as missed.

The artifact plans each job's future too (a free-GPU profile over time) to estimate its end;
only the allocation at the current instant is ever enacted, and it depends only on the GPUs
the earlier-deadline jobs took now, which is what this module computes.
"""

from __future__ import annotations

import math
from types import MappingProxyType

from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from policies.base import Fitter, JobView, Plan, Policy, Snapshot
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable


def deadline_key(job: JobView) -> tuple[float, float, str]:
    deadline = job.spec.deadline_s
    late = math.inf if deadline is None or job.spec.best_effort else deadline
    return (late, job.spec.submit_time_s, job.job_id)


def edf_share(job: JobView, free: int, cluster_gpus: int) -> int:
    """GPUs the job takes now with `free` GPUs left (0: it waits)."""
    levels = job.spec.gpu_levels
    quota = min(max(levels), cluster_gpus)
    if free >= quota:
        return quota
    fitting = [g for g in levels if g <= free]
    return max(fitting) if fitting else 0


class Edf(Policy):
    name = "edf"
    description = "Earliest deadline first with elastic shares (ElasticFlow's EDF baseline)"
    placement = "count"
    replan = "slot"

    def __init__(self) -> None:
        self._position: dict[str, int] = {}
        self._last: Plan | None = None

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        plan = Plan()
        total = snap.cluster.total_gpus
        order = sorted(snap.jobs.values(), key=deadline_key)
        for job in order:
            share = edf_share(job, fit.free_gpus, total)
            slots = None
            # The count placer fits any share that the free GPUs allow; smaller levels are a
            # fallback should a topology-aware placer refuse one.
            for g in sorted((x for x in job.spec.gpu_levels if x <= share), reverse=True):
                slots = fit.try_place(job.job_id, g)
                if slots is not None:
                    break
            if slots is None:
                plan.blocked[job.job_id] = Status(
                    code=StatusCode.WAITING_FOR_GPUS,
                    reason=f"earlier deadlines hold the GPUs ({fit.free_gpus} free)",
                    decided_by=self.name)
                continue
            plan.run[job.job_id] = slots
        waiting = [j.job_id for j in order if j.job_id not in plan.run]
        self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        self._last = plan
        plan.free_gpus = fit.free_gpus
        return plan

    def job_removed(self, job_id: str) -> None:
        self._position.pop(job_id, None)

    def waiting_status(self, job_id: str) -> Status:
        blocked = self._last.blocked.get(job_id) if self._last is not None else None
        reason = blocked.reason if blocked is not None else "earlier deadlines hold the GPUs"
        return Status(code=StatusCode.WAITING_FOR_PRIORITY, reason=reason, decided_by=self.name,
                      queue_position=self._position.get(job_id))


Profile = dict[float, int]  # free GPUs over time as ElasticFlow plans them: breakpoint → free


def merge_profile(free: Profile) -> Profile:
    """Drop breakpoints that repeat the previous value (the artifact's `merge_dict`).

    Breakpoints are taken in time order; the first is always kept."""
    out: Profile = {}
    last: int | None = None
    for t in sorted(free):
        if free[t] != last:
            out[t] = free[t]
            last = free[t]
    return out


def align_to_slot(start: float, t: float, slot: float) -> float:
    """`t` rounded up to the slot grid that starts at `start` (`align_to_time_slot`)."""
    n, rest = divmod(t - start, slot)
    return start + (n + (1 if rest > 0 else 0)) * slot


def plan_edf(job: JobView, free: Profile, now: float, total: int, slot: float
             ) -> tuple[bool, Profile]:
    """Plan one job into the free-GPU profile after the earlier-deadline jobs (the artifact's
    `edf_sim_allocation`): whether its estimated end meets its deadline, and the profile with
    the job's GPUs taken out.

    Each period between breakpoints it runs at its base quota if that many GPUs are free, else
    at the largest level that fits; after the last breakpoint the whole cluster is free again.
    End times are rounded up to whole seconds, as the artifact's are.
    """
    spec = job.spec
    deadline = math.inf if spec.deadline_s is None or spec.best_effort else spec.deadline_s
    rate = {g: 1.0 / spec.iteration_time_at(g) for g in spec.gpu_levels}
    quota = min(max(spec.gpu_levels), total)
    left = job.remaining_iterations
    new = dict(free)
    ok = True
    at = now
    available = free[now]
    for t in sorted(free):
        if t <= at:
            available = free[t]
            continue
        use = edf_share(job, available, total)
        if use:
            end = math.ceil(at + left / rate[use])
            if t >= end:
                before_end = total  # free GPUs at the last breakpoint before the end
                for u in sorted(free):
                    if at <= u < end:
                        before_end = new[u]
                        new[u] -= use
                if at != end:
                    new[at] = available - use
                if end not in free:
                    new[align_to_slot(now, end, slot)] = before_end
                return ok and end <= deadline, merge_profile(new)
            left -= (t - at) * rate[use]
            new[at] = new.get(at, available) - use
        available = new[t]
        at = t
        if at > deadline:
            ok = False
    end = math.ceil(at + left / rate[quota])
    new[at] = total - quota
    new[align_to_slot(now, end, slot)] = total
    return ok and end <= deadline, merge_profile(new)


class EdfAccessControl(Edf):
    name = "edf-accessctrl"
    description = "EDF that declines a new job when the EDF plan then misses a deadline"

    def __init__(self) -> None:
        super().__init__()
        self.slot_s = 60.0
        self.admitted: set[str] = set()
        self.accepted = 0
        self.declined = 0

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        self.slot_s = round_s

    def job_removed(self, job_id: str) -> None:
        super().job_removed(job_id)
        self.admitted.discard(job_id)

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        total = snap.cluster.total_gpus
        declined: dict[str, str] = {}
        for job in snap.jobs.values():  # admission order: the artifact tests them in turn
            if job.job_id in self.admitted:
                continue
            trial = sorted([snap.jobs[j] for j in self.admitted] + [job], key=deadline_key)
            profile: Profile = {snap.now: total}
            feasible = True
            for j in trial:  # every job is planned: later ones see the earlier ones' GPUs
                met, profile = plan_edf(j, profile, snap.now, total, self.slot_s)
                feasible = feasible and met
            if feasible or job.spec.best_effort:
                self.admitted.add(job.job_id)
                self.accepted += 1
            else:
                declined[job.job_id] = "its deadline cannot be met beside the admitted jobs"
                self.declined += 1
        admitted = Snapshot(snap.now, snap.cluster,
                            MappingProxyType({j: v for j, v in snap.jobs.items()
                                              if j in self.admitted}), snap.running)
        plan = super().plan(admitted, fit)
        plan.declined = declined
        return plan
