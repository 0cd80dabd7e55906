"""Drive a policy cycle by cycle the way SchedulerCore does, without the bus.

The contract the scheduler keeps and this driver mirrors:
- `job_added(view)` once when a job becomes active, `job_removed(id)` once when it finishes;
- every cycle, a `Snapshot` of all active jobs, the running ones as running views whose progress
  and attained time were advanced to `now`, and a fresh `CyclePlacement` with the previous
  placements of the running jobs;
- afterwards, the jobs in `plan.run` are running (with the placement planned), and so are
  the running jobs a plan that keeps them (`stay`) does not preempt; all others wait (a
  preempted job keeps its progress and counts one more preemption).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

import policies
from domain.placement import CyclePlacement
from policies.base import JobView, Plan, Policy, Snapshot
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.status import Status


def running_after(plan: Plan, running: dict[str, GpuSlots]) -> dict[str, GpuSlots]:
    """Which jobs run where after `plan`, those `running` (where) before it."""
    if not plan.stay:
        return dict(plan.run)
    return {jid: slots for jid, slots in running.items() if jid not in plan.preempted} | plan.run


@dataclass
class Rec:
    spec: JobSpec
    done: float = 0.0  # iterations
    attained_s: float = 0.0
    running: bool = False
    placement: GpuSlots = ()
    preemptions: int = 0

    def view(self) -> JobView:
        return JobView.make(self.spec, self.running, self.done, self.attained_s,
                            self.preemptions)


@dataclass
class Driver:
    policy: Policy
    cluster: ClusterSpec
    now: float = 0.0
    jobs: dict[str, Rec] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)  # job id → end time
    plan: Plan | None = None
    fit: CyclePlacement | None = None

    @classmethod
    def of(cls, name: str, cl: ClusterSpec) -> Driver:
        return cls(policies.make(name), cl)

    # -- inputs ------------------------------------------------------------------------------
    def add(self, *specs: JobSpec) -> Driver:
        for spec in specs:
            rec = self.jobs[spec.job_id] = Rec(spec)
            self.policy.job_added(rec.view())
        return self

    def advance(self, to: float) -> None:
        """Let running jobs progress until `to`; jobs that complete leave (job_removed)."""
        assert to >= self.now
        dt = to - self.now
        for jid, rec in list(self.jobs.items()):
            if rec.running:
                left = rec.spec.iterations - rec.done
                rec.done = min(rec.spec.iterations, rec.done + dt / rec.spec.iteration_time_s)
                rec.attained_s += dt
                if rec.done >= rec.spec.iterations:
                    self.finished[jid] = self.now + left * rec.spec.iteration_time_s
                    del self.jobs[jid]
                    self.policy.job_removed(jid)
        self.now = to

    # -- a scheduling cycle --------------------------------------------------------------------
    def cycle(self, at: float | None = None) -> Plan:
        if at is not None:
            self.advance(at)
        snap = self.snapshot()
        previous = {jid: rec.placement for jid, rec in self.jobs.items() if rec.running}
        self.fit = CyclePlacement(self.cluster, self.policy.placement, previous)
        plan = self.plan = self.policy.plan(snap, self.fit)
        runs = running_after(plan, previous)
        for jid, rec in self.jobs.items():
            if jid in runs:
                rec.running, rec.placement = True, runs[jid]
            elif rec.running:
                rec.running, rec.placement = False, ()
                rec.preemptions += 1
        return plan

    def snapshot(self) -> Snapshot:
        """What a cycle at `now` shows the policy."""
        views = {jid: rec.view() for jid, rec in self.jobs.items()}
        running = tuple(views[jid] for jid, rec in self.jobs.items() if rec.running)
        return Snapshot(self.now, self.cluster, MappingProxyType(views), running)

    # -- queries -------------------------------------------------------------------------------
    @property
    def running(self) -> set[str]:
        return {jid for jid, rec in self.jobs.items() if rec.running}

    def waiting_order(self) -> list[str]:
        """Waiting jobs by the queue position the policy reports."""
        pos = {jid: self.status(jid).queue_position for jid, r in self.jobs.items()
               if not r.running}
        assert all(p is not None for p in pos.values()), pos
        order = sorted(pos, key=lambda j: pos[j] or 0)
        assert [pos[j] for j in order] == list(range(1, len(order) + 1)), pos
        return order

    def status(self, job_id: str) -> Status:
        return self.policy.waiting_status(job_id)
