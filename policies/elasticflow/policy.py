"""ElasticFlow (ASPLOS'23) with admission control, as its artifact runs it (`ef-accessctrl`).

Every cycle (slotted, 60 s by default) the admitted jobs are planned at their minimum
satisfactory share in deadline order and the GPUs left free are handed out by marginal return
(the planner: `policies.elasticflow.reference`, or its fast path, chosen by
`policies.elasticflow.planner`).

Admission: when jobs arrive, the admitted jobs and the newcomers are planned together; if any
of them would then miss its deadline, *every* newcomer of that cycle is declined (the
artifact's quirk: one merged event admits all of its new jobs or none, and an admitted job
already running late blocks every arrival). Best-effort jobs (and jobs without a deadline)
have an infinite deadline: they are always admitted and planned after the deadline jobs.

Paper against artifact: the paper hands leftover GPUs out "based on diminishing returns",
i.e. to the job that gains most from one more GPU, which in GPU-time terms is the *smallest*
increase per added GPU. The artifact sorts the increase in *descending* order, so among jobs
that already run the worst scaler grows first. We keep the artifact's order, because the
published figures come from that code and this policy exists to reproduce them;
`ElasticFlow.leftover_order` names the choice, and an unregistered subclass with "ascending"
gives the paper's reading (jobs holding no GPU still first). docs/validation.md has what
either order gives on Fig. 8a.

Only the allocation now is enacted; the planned future decides when to look again: the policy
asks for a cycle at the first time any job's plan changes its GPU count (the artifact's
scaling events). Jobs may use the GPU counts of their throughput table up to the artifact's
per-model cap (`models.get_max_gpu`: e.g. T4 yolov3 at most 4, ncf 1, A100 bert batch 64 at
most 8); a job without a scaling table runs at its requested size or not at all.

Placement is by count (ElasticFlow's buddy allocation never fails to place what its planner
gives: power-of-two gangs on power-of-two nodes, so only the count matters here).

Under a tenants file or queues the planner still plans the whole cluster, and the admission
step may refuse a job it gave GPUs to; the jobs left waiting are then planned again into the
GPUs left, until none is refused (`_replan_refused`), so a refusal never idles GPUs and a
queue reclaiming its quota gets its jobs planned. Without such rules nothing changes.

What differs from the artifact is the simulator around the planner: Loom ends a job when its
work is done, not at its slot-aligned planned end, charges overheads by its own model, and
judges a deadline by the simulated end where the artifact takes the planned one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar, Literal

from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from policies.base import Fitter, Plan, Policy, Snapshot
from policies.elasticflow.model import NO_DEADLINE, Allotted, Need
from policies.elasticflow.planner import planner_for
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable


class ElasticFlow(Policy):
    name = "elasticflow"
    description = ("ElasticFlow: admission by minimum satisfactory share, elastic scaling, "
                   "spare GPUs by marginal return")
    placement = "count"
    replan = "slot"
    leftover_order: ClassVar[Literal["descending", "ascending"]] = "descending"

    def __init__(self) -> None:
        self.slot_s = 60.0
        self._order: list[str] = []  # admitted jobs, in the artifact's `runnable_jobs` order
        self._admitted: set[str] = set()
        self._status: dict[str, Status] = {}
        self._speeds: dict[str, Mapping[int, float]] = {}  # each active job's, by job id
        self.accepted = 0
        self.declined = 0

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        self.slot_s = round_s

    def job_removed(self, job_id: str) -> None:
        if job_id in self._admitted:
            self._admitted.discard(job_id)
            self._order.remove(job_id)
        self._status.pop(job_id, None)
        self._speeds.pop(job_id, None)

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        now, total, slot = snap.now, snap.cluster.total_gpus, self.slot_s
        needs = {jid: Need.of(job, self._speeds) for jid, job in snap.jobs.items()}
        arrived = [jid for jid in snap.jobs if jid not in self._admitted]
        declined: dict[str, str] = {}
        descending = self.leftover_order == "descending"
        jobs: list[Allotted] | None = None
        if arrived:
            # Planned with the newcomers, in the deadline order they would then have.
            trial = [needs[j] for j in _by_deadline(self._order + arrived, needs)]
            jobs = planner_for(trial).plan_cycle(trial, now, total, slot,
                                                 descending=descending, all_met=True)
            if jobs is not None:
                self._admit(arrived)
            else:
                admitted = [j for j in arrived if needs[j].deadline == NO_DEADLINE]
                self._admit(admitted)
                reason = (f"a deadline would be missed if the {len(arrived)} job(s) arriving "
                          "now were admitted" if len(arrived) > 1 else
                          "its deadline cannot be met beside the admitted jobs")
                for jid in arrived:
                    if jid not in self._admitted:
                        declined[jid] = reason
                        self.declined += 1
        self._order = _by_deadline(self._order, needs)
        if jobs is None:
            ordered = [needs[j] for j in self._order]
            jobs = planner_for(ordered).plan_cycle(ordered, now, total, slot,
                                                   descending=descending)
            assert jobs is not None
        jobs.sort(key=lambda g: -g.gpus)  # the artifact places the largest jobs first
        self._order = [g.need.job_id for g in jobs]
        return self._place(snap, fit, jobs, declined)

    def _admit(self, job_ids: Iterable[str]) -> None:
        for jid in job_ids:
            self._admitted.add(jid)
            self._order.append(jid)
            self.accepted += 1

    def _place(self, snap: Snapshot, fit: Fitter, jobs: list[Allotted],
               declined: dict[str, str]) -> Plan:
        plan = Plan(declined=declined)
        self._status = {}
        refused = self._reserve(snap, fit, jobs, plan)
        final, timed = jobs, jobs
        if refused and not fit.fails_by_size:
            final, timed = self._replan_refused(snap, fit, jobs, plan)
        waiting = (g for g in final if not g.gpus)
        for position, g in enumerate(waiting, start=1):
            starts = g.next_change
            reason = ("its plan starts it when the GPUs free up" if starts is None else
                      f"its plan starts it at t={starts:g}")
            self._status[g.need.job_id] = Status(
                code=StatusCode.WAITING_FOR_PRIORITY, reason=reason, decided_by=self.name,
                queue_position=position)
        changes = [g.next_change for g in timed if g.next_change is not None]
        plan.wakeup_at = min(changes) if changes else None
        plan.free_gpus = fit.free_gpus
        return plan

    def _replan_refused(self, snap: Snapshot, fit: Fitter, jobs: list[Allotted], plan: Plan
                        ) -> tuple[list[Allotted], list[Allotted]]:
        """A fitter with per-job rules (tenant quotas, the queue layer) refused jobs the
        planner gave GPUs to, GPUs it gave no one else: they would idle while jobs wait, and a
        queue reclaiming its quota would never get it (its jobs were planned at 0). So the
        jobs still waiting are planned again into the GPUs left, until none is refused. A
        placer's own fitter fails by size alone, so runs without such rules never come here.

        Returns every job's last allotment, and those whose plans set the next wakeup: the
        last plan's, made into the GPUs left without a refused job. A plan that gave GPUs to
        a refused job is not enacted, and the changes it foresaw for everyone (a refused
        job's end, what starts or shrinks then) would wake the scheduler every few slots for
        nothing, cycle after cycle; the jobs that do run end with an event, which re-plans."""
        final: list[Allotted] = jobs
        timed: list[Allotted] = []
        refused = True
        while refused:
            free = fit.free_gpus
            # Only jobs that fit in what is left: the planner assumes every job fits its total.
            waiting = sorted((g.need for g in final if not g.gpus and g.need.levels[0] <= free),
                             key=lambda n: n.deadline)
            if not waiting:
                break
            again = planner_for(waiting).plan_cycle(
                waiting, snap.now, free, self.slot_s,
                descending=self.leftover_order == "descending")
            assert again is not None  # not an admission check: always a plan
            again.sort(key=lambda g: -g.gpus)
            refused = self._reserve(snap, fit, again, plan)
            replanned = {n.job_id for n in waiting}
            final = [g for g in final if g.need.job_id not in replanned] + again
            timed = [] if refused else again
        return final, timed

    def _reserve(self, snap: Snapshot, fit: Fitter, jobs: list[Allotted], plan: Plan) -> bool:
        """Reserve the jobs' planned GPUs into `plan`; whether any was refused."""
        # Jobs keeping their GPU count first, so they keep their GPUs (no restart).
        keep: list[Allotted] = []
        change: list[Allotted] = []
        for g in jobs:
            if g.gpus:
                same = snap.jobs[g.need.job_id].allocated == g.gpus
                (keep if same else change).append(g)
        refused = False
        for g in keep + change:
            jid = g.need.job_id
            slots = None
            # Count placement fits whatever the plan gave out; a topology-aware placement
            # (--placement) may refuse a gang, and the job then takes a smaller level.
            for size in (x for x in reversed(g.need.levels) if x <= g.gpus):
                slots = fit.try_place(jid, size)
                if slots is not None:
                    break
            if slots is None:
                self._status[jid] = Status(
                    code=StatusCode.WAITING_FOR_CONSOLIDATED_GPUS, reason=fit.explain(g.gpus),
                    decided_by=self.name)
                refused = True
                continue
            plan.run[jid] = slots
        return refused

    def waiting_status(self, job_id: str) -> Status:
        return self._status.get(job_id, Status(
            code=StatusCode.WAITING_FOR_PRIORITY, reason="waiting for the next slot",
            decided_by=self.name))


def _by_deadline(job_ids: Iterable[str], needs: Mapping[str, Need]) -> list[str]:
    """Stable deadline order (ties keep their order, as the artifact's list sorts do)."""
    return sorted(job_ids, key=lambda j: needs[j].deadline)
