"""Muri (SIGCOMM'22): interleave jobs that share GPUs so each resource serves one at a time.

Each cycle, following Muri's simulator (`multi_resource_blossom_same_sim_jobs`):
1. Rank every active job: `muri-s` by remaining GPU-time (durations known; a job that never
   ran is ranked by its trace duration, as Muri does), `muri-l` by attained GPU-time (unknown
   durations). Ties: jobs seen in an earlier cycle first, larger gangs first, then arrival.
2. Candidates: walk the ranking on an empty cluster; each job that fits there brings in the
   next up to four jobs of its GPU count. At most 4× the cluster is considered.
3. Group candidates of equal GPU count by repeated maximum-weight matching on the fraction of
   resource slots a group keeps busy, merging only while their demand exceeds the cluster
   (`policies.muri.matching`).
4. Split any group slower than running its members one after another ("autopack").
5. Place groups in rank order (a group ranks as its best member); a group's jobs share GPUs.

Group speed and per-event cost come from `domain.interleave`/`overhead`, the same
model the simulated nodes run.
"""

from __future__ import annotations

from typing import ClassVar

from numpy.typing import ArrayLike

from domain.interleave import MAX_GROUP, Stages, group_iteration_time
from domain.overhead import MURI_SLOWDOWN, OverheadModel
from domain.placement import CyclePlacement, Scheme
from domain.topology import Topology
from policies.base import Fitter, JobView, Plan, Policy, Snapshot, status_for_waiting
from policies.muri.matching import Group, group_by_matching
from schemas.status import Status
from schemas.throughputs import ThroughputTable

Key = tuple[float, int, int, int]


class Muri(Policy):
    placement = "consolidated"
    replan = "event"
    know_duration: ClassVar[bool]

    def __init__(self) -> None:
        self._arrival: dict[str, int] = {}
        self._gpus: dict[str, int] = {}
        self._new: set[str] = set()
        self._rank: dict[str, int] = {}
        self._last: Plan | None = None
        self._topology: Topology | None = None
        self._scratch: CyclePlacement | None = None  # an empty cluster to try sizes on
        self.slowdown = MURI_SLOWDOWN

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        # Muri's simulator runs every iteration 1.5 % slower than the trace says; rank by that
        # only where the run's overhead model does so too (unconfigured: Muri's own model).
        self.slowdown = MURI_SLOWDOWN if overhead is None or overhead.kind == "muri" else 1.0

    # -- bookkeeping -----------------------------------------------------------------------
    def job_added(self, job: JobView) -> None:
        self._arrival[job.job_id] = len(self._arrival)
        self._gpus[job.job_id] = job.gpus
        self._new.add(job.job_id)

    def job_removed(self, job_id: str) -> None:
        self._arrival.pop(job_id, None)
        self._gpus.pop(job_id, None)
        self._new.discard(job_id)
        self._rank.pop(job_id, None)

    def sort_value(self, job: JobView) -> float:
        if not self.know_duration:
            return job.attained_gpu_s
        if not job.running and job.attained_s == 0 and job.spec.duration_s is not None:
            return job.spec.duration_s * job.gpus  # Muri ranks a job that never ran this way
        return job.remaining_iterations * job.spec.iteration_time_s * self.slowdown * job.gpus

    def key(self, job: JobView) -> Key:
        new = 1 if job.job_id in self._new else 0
        return (self.sort_value(job), new, -job.gpus, self._arrival[job.job_id])

    # -- the cycle -------------------------------------------------------------------------
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        ranked = sorted(snap.jobs.values(), key=self.key)
        self._rank = {j.job_id: i for i, j in enumerate(ranked)}
        self._new.clear()
        value = {j.job_id: self.sort_value(j) for j in ranked}
        candidates = self._candidates(snap, ranked, fit)
        stages: dict[str, Stages] = {
            jid: snap.jobs[jid].spec.stage_times_s  # type: ignore[misc]
            for jobs in candidates.values() for jid in jobs
            if snap.jobs[jid].spec.stage_times_s is not None
        }
        groups = group_by_matching(candidates, snap.cluster.total_gpus, stages)
        units = self._autopack(snap, groups, stages)
        units.sort(key=lambda u: min(value[j] for j in u[1]))  # stable, as Muri's sort
        plan = Plan()
        for gpus, members in units:
            slots = fit.try_place(members[0], gpus)
            if slots is None:
                continue
            for jid in members:
                plan.run[jid] = slots
                if len(members) > 1:
                    plan.groups[jid] = tuple(sorted(members))
        plan.free_gpus = fit.free_gpus
        self._last = plan
        return plan

    def _candidates(self, snap: Snapshot, ranked: list[JobView], fit: Fitter
                    ) -> dict[int, list[str]]:
        """Per GPU count (in order of first appearance), the jobs Muri considers this cycle."""
        by_size: dict[int, list[str]] = {}
        for job in ranked:
            by_size.setdefault(job.gpus, []).append(job.job_id)
        chosen = dict.fromkeys(by_size, 0)
        marked: set[str] = set()
        scheme: Scheme = "yarn" if fit.scheme == "yarn" else "consolidated"
        scratch = self._scratch
        if (scratch is None or self._topology is None
                or self._topology.cluster is not snap.cluster or scratch.scheme != scheme):
            self._topology = Topology(snap.cluster)
            scratch = self._scratch = CyclePlacement(self._topology, scheme)
        else:
            scratch.next_cycle()  # an empty cluster again, resetting only what was placed
        for job in ranked:
            if scratch.free_gpus == 0:
                break
            if job.job_id in marked or scratch.try_place(job.job_id, job.gpus) is None:
                continue
            jobs = by_size[job.gpus]
            upto = min(chosen[job.gpus] + MAX_GROUP, len(jobs))
            marked.update(jobs[chosen[job.gpus]: upto])
            chosen[job.gpus] = upto
        return {g: by_size[g][:n] for g, n in chosen.items() if n}

    def _autopack(self, snap: Snapshot, groups: dict[int, list[Group]],
                  stages: dict[str, Stages]) -> list[tuple[int, Group]]:
        """Split a group that is slower than its members run one after another."""
        units: list[tuple[int, Group]] = []
        for gpus, gs in groups.items():
            for group in gs:
                if len(group) > 1:
                    together = group_iteration_time([stages[j] for j in group])
                    apart = sum(snap.jobs[j].spec.iteration_time_s * self.slowdown
                                for j in group)
                    if together / apart > 1:
                        units += [(gpus, (j,)) for j in group]
                        continue
                units.append((gpus, group))
        return units

    def waiting_status(self, job_id: str) -> Status:
        return status_for_waiting(job_id, self._gpus.get(job_id, 0), self._last,
                                  self._rank.get(job_id, 0) + 1, self.name)


class MuriS(Muri):
    name = "muri-s"
    description = "Muri-S: interleave same-size jobs (blossom matching), least remaining GPU-time"
    know_duration = True


class MuriL(Muri):
    name = "muri-l"
    description = "Muri-L: interleave same-size jobs (blossom matching), least attained GPU-time"
    know_duration = False
