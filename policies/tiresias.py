"""Tiresias' discretised LAS: a multi-level feedback queue on attained service.

Follows the Tiresias simulator's `dlas` path (as Muri and ElasticFlow reuse it):
- new jobs enter Q0; a running job whose attained service reaches its queue's limit moves one
  queue down, to the back of that queue;
- queues are walked Q0, Q1, …; within a queue, jobs that ran last cycle come first in their
  order, then waiting jobs in their order (each cycle pushes waiting jobs behind running ones);
- admission counts GPUs only (no consolidation), all-or-nothing, no head-of-line blocking;
- a re-plan is scheduled for the instant the next running job crosses a queue limit.

Keys encode the queue lists: (queue, 0, rank) for a job that ran last cycle, (queue, 1, seq)
for a waiting one, so a waiting job's key never changes while it waits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice, takewhile
from typing import ClassVar

from sortedcontainers import SortedList

from policies.base import (
    Fitter,
    JobView,
    Plan,
    RunningJobs,
    Snapshot,
    running_attained_of,
    running_specs,
)
from policies.mechanisms.counting import count_walk
from policies.mechanisms.ordered import Key, OrderedPolicy
from policies.mechanisms.walk import greedy_fill, place_counted

# Tiresias simulator constants (jobs.py): 3 queues; only the first two limits matter.
QUEUE_LIMITS: tuple[float, ...] = (3250.0, 7200.0)
DEMOTION_TOLERANCE = 1e-6  # GPU-seconds
# How far a running job's attained time, summed cycle by cycle, may stray from a straight line
# from when it was last seen (rounding: about 1e-10 s a cycle): its crossing time as predicted
# then is within this of the true one, so only jobs predicted this close are read.
DRIFT_S = 1.0


class DiscretisedLas(OrderedPolicy):
    """Where many jobs run (the scheduler makes their views only when read), a running job's
    key changes only when a cycle re-ranks it, and its attained time grows with the clock: so
    its key and when it will cross its queue's limit are kept from when it was last seen, and
    an in-place cycle reads only the running jobs predicted to cross about now."""

    placement = "count"
    keys_fall = True  # a running job's key is set by the plans alone
    views_for_keys = False  # its keys are kept (`running_key`)
    gpu_time: ClassVar[bool]
    limits: ClassVar[tuple[float, ...]] = QUEUE_LIMITS

    def __init__(self) -> None:
        super().__init__()
        self._queue: dict[str, int] = {}
        self._key: dict[str, Key] = {}
        self._back = 0  # appends to the back of a queue
        self._front = 0  # preempted jobs go in front of the waiting part of their queue
        self._next_rank = 0  # above every running job's rank (see `plan_in_place`)
        # Running jobs' predicted demotion and wake-up times (None: bottom queue), and both
        # sorted: kept where the scheduler makes running jobs' views only when read.
        self._due: dict[str, tuple[float, float] | None] = {}
        self._demotions: SortedList = SortedList()
        self._wakeups: SortedList = SortedList()

    def attained(self, job: JobView) -> float:
        return job.attained_gpu_s if self.gpu_time else job.attained_s

    def _service(self, gpus: int, attained_s: float) -> float:
        """`attained` from a job's GPUs and the seconds it has held them."""
        return attained_s * gpus if self.gpu_time else attained_s

    def _held(self, job_id: str, snap: Snapshot) -> tuple[int, float]:
        """A job's GPUs and the seconds it has held them, as its view holds them: a running
        job's read without making its view where the snapshot gives them."""
        attained_of = running_attained_of(snap)
        read = None if attained_of is None else attained_of(job_id)
        if read is None:
            job = snap.jobs[job_id]
            return job.gpus, job.attained_s
        return read[0].gpus, read[1]

    def key(self, job: JobView) -> Key:
        return self._key[job.job_id]

    def running_key(self, job_id: str, snap: Snapshot) -> Key:
        return self._key[job_id]

    def _append(self, job_id: str, queue: int) -> Key:
        self._back += 1
        self._queue[job_id] = queue
        k: Key = (queue, 1, self._back)
        self._key[job_id] = k
        return k

    def job_added(self, job: JobView) -> None:
        # A new job starts in queue 0; one re-announced after a rebuild where its attained
        # service puts it.
        self._enqueue(job, self._append(job.job_id, self._level(job)))

    def job_running(self, job: JobView) -> None:
        super().job_running(job)
        self._key[job.job_id] = (self._queue[job.job_id], 0, self._back)
        self._next_rank = max(self._next_rank, self._back + 1)

    def _level(self, job: JobView) -> int:
        attained = self.attained(job)
        return sum(attained >= limit - DEMOTION_TOLERANCE for limit in self.limits)

    def job_removed(self, job_id: str) -> None:
        super().job_removed(job_id)
        self._unpredict(job_id)
        self._queue.pop(job_id, None)
        self._key.pop(job_id, None)

    def job_requeued(self, job: JobView) -> None:
        self._unpredict(job.job_id)
        super().job_requeued(job)

    def running_stays(self, snap: Snapshot) -> bool:
        return False  # new jobs enter queue 0, ahead of running ones: `plan_in_place` decides

    def _demoted(self, snap: Snapshot) -> list[str]:
        """Running jobs whose attained service reached their queue's limit: one level down
        this cycle (at most one, as Tiresias does)."""
        return [job.job_id for job in snap.running
                if self._crossed(job.job_id, job.gpus, job.attained_s)]

    def _crossed(self, job_id: str, gpus: int, attained_s: float) -> bool:
        """Whether a running job's attained service reached its queue's limit."""
        q = self._queue[job_id]
        # Tolerance: a wake-up for the crossing can land a hair before it in floating point
        # (e.g. 3249.9999999999995 GPU-s); without it that instant would re-plan forever.
        return (q < len(self.limits)
                and self._service(gpus, attained_s) >= self.limits[q] - DEMOTION_TOLERANCE)

    def plan_in_place(self, snap: Snapshot, fit: Fitter) -> Plan | None:
        # Every running job keeps its key but those demoted now (to the back of the next
        # queue, as the full plan does), and the walk over waiting jobs decides as the full walk
        # would (OrderedPolicy.walk_in_place). Jobs that start, and those demoted, get ranks
        # after every running job's, in the order of their keys: the full walk's order.
        running = snap.running
        if not isinstance(running, RunningJobs):
            if self._demoted(snap):
                return None
            plan = self.walk_in_place(snap, fit)
            if plan is not None:
                self._rank_anew(list(plan.run))
                plan.wakeup_at = self._next_demotion(
                    snap, [*(v.job_id for v in snap.running), *plan.run])
                self._last = plan
            return plan
        demoted = running.in_order(self._kept_demoted(snap, running))
        before = self._back, [(jid, self._queue[jid], self._key[jid]) for jid in demoted]
        for jid in demoted:
            self._bounds.take(jid, self._append(jid, self._queue[jid] + 1))
        plan = self.walk_in_place(snap, fit)
        if plan is None:  # as it was: the full plan demotes them
            self._back = before[0]
            for jid, q, k in before[1]:
                self._queue[jid], self._key[jid] = q, k
                self._bounds.take(jid, k)
            return None
        self._rank_anew([*plan.run, *demoted])
        for jid in [*plan.run, *demoted]:
            self._bounds.take(jid, self._key[jid])
            self._predict(jid, snap)
        plan.wakeup_at = self._kept_wakeup(snap)
        self._last = plan
        return plan

    def _rank_anew(self, jobs: list[str]) -> None:
        """Ranks above every running job's for jobs that start (out of the waiting index) or
        are demoted in place, in the order of their keys."""
        for _, jid in sorted((self._key[jid], jid) for jid in jobs):
            self._unqueue(jid)
            self._key[jid] = (self._queue[jid], 0, self._next_rank)
            self._next_rank += 1

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        running = snap.running
        plan = (self._plan_kept(snap, fit, running) if isinstance(running, RunningJobs)
                else self._plan_all(snap, fit))
        self._last = plan
        return plan

    def _plan_all(self, snap: Snapshot, fit: Fitter) -> Plan:
        """The full walk over every running job's view, ranks numbered from 0."""
        for jid in self._demoted(snap):
            self._append(jid, self._queue[jid] + 1)
        running = sorted((self._key[v.job_id], v.job_id) for v in snap.running)
        plan = greedy_fill(self.streams(running), snap.jobs, fit, self.name)
        for jid in plan.run:
            self._unqueue(jid)  # out of the waiting index (its key is set below)
        for rank, jid in enumerate(plan.run):  # plan.run is in walk order
            self._key[jid] = (self._queue[jid], 0, rank)
        self._next_rank = len(plan.run)
        self._requeue_preempted([item for item in running if item[1] not in plan.run], snap)
        plan.wakeup_at = self._next_demotion(snap, plan.run)
        self._due.clear()
        self._demotions.clear()
        self._wakeups.clear()
        self._bounds.reset([])
        return plan

    def _plan_kept(self, snap: Snapshot, fit: Fitter, running: RunningJobs) -> Plan:
        """The full walk where the scheduler makes running jobs' views only when read. The
        running jobs ahead of every waiting job keep their GPUs and their keys
        (`OrderedPolicy._walk_start`), and the ranks of those walked stand: only jobs that
        start or are demoted get ranks, after every running job's, in walk order. Within a
        queue that orders the keys as numbering every job from 0 in walk order would, and
        ranks are compared within a queue alone. Predicted crossings are kept but for the
        jobs whose queue changes."""
        demoted = running.in_order(self._kept_demoted(snap, running))
        for jid in demoted:
            self._bounds.take(jid, self._append(jid, self._queue[jid] + 1))
        if fit.counts_decide and not running.irregular:
            counted = self._plan_counted(snap, fit, running, demoted)
            if counted is not None:
                return counted
        kept, ranked = self._walk_start(snap, fit)
        plan = greedy_fill(self.streams(ranked), snap.jobs, fit, self.name, kept,
                           running.spec_of)
        # Starts and demotions. Of the running jobs kept ahead (plan.run's first `kept`), only
        # one demoted just now can have a fresh key: without demotions, none is looked at.
        start = 0 if demoted else plan.kept
        self._settle_walk(plan, snap,
                          [jid for jid in islice(plan.run, start, None) if self._key[jid][1] == 1],
                          [item for item in ranked if item[1] not in plan.run])
        return plan

    def _plan_counted(self, snap: Snapshot, fit: Fitter, running: RunningJobs,
                      demoted: list[str]) -> Plan | None:
        """`_plan_kept` where counts decide: the same walk counted over the running jobs'
        exact ranks (`count_walk`; a running job's key is kept here, so its bound is its
        key), which costs the jobs that start or are given up. Every other running job stays
        where it runs (`Fitter.stay_but`), so the plan lists only what changes. None, with
        nothing done but the demotions, where the placement refuses."""
        spec_of = running.spec_of
        self._bounds.take_reports(running, self._key_of(snap))
        order = self._bounds.order
        if spec_of is None or len(order) != len(running.ids):
            return None

        def gpus_of(job_id: str) -> int:
            spec = spec_of(job_id)
            assert spec is not None, f"{job_id} is ranked as running"
            return spec.gpus

        starting, given_up = count_walk(order, gpus_of, self.waiting_streams(), snap.jobs,
                                        fit)
        if not fit.stay_but(running.ids, given_up):
            return None
        plan = Plan(stay=True, preempted=given_up)
        place_counted(plan, starting, fit, self.name, {})
        self._settle_walk(plan, snap,
                          [*plan.run, *(jid for jid in demoted if jid not in given_up)],
                          [(self._key[jid], jid) for jid in given_up])
        return plan

    def _settle_walk(self, plan: Plan, snap: Snapshot, fresh: list[str],
                     preempted: list[tuple[Key, str]]) -> None:
        """After a full walk where running jobs' views are made only when read: ranks for
        the jobs that start or stay demoted (`fresh`), the preempted ones requeued, the
        predicted crossings of both changed, and the next wake-up."""
        self._rank_anew(fresh)
        for _, jid in preempted:
            self._bounds.drop(jid)
            self._unpredict(jid)
        self._requeue_preempted(preempted, snap)
        for jid in fresh:
            self._bounds.take(jid, self._key[jid])
            self._predict(jid, snap)
        plan.wakeup_at = self._kept_wakeup(snap)

    def _requeue_preempted(self, preempted: list[tuple[Key, str]], snap: Snapshot) -> None:
        """A preempted job keeps its place in the walk: one that ran last cycle goes in front
        of its queue's waiting jobs; one demoted this cycle stays at the back of its new
        queue. (Filed by the spec where the running jobs' records give it: a view made now
        would be out of date once the job stops.)"""
        spec_of = running_specs(snap)
        for k, jid in sorted(preempted, reverse=True):
            if k[1] == 0:
                self._front -= 1
                k = (self._queue[jid], 1, self._front)
                self._key[jid] = k
            spec = None if spec_of is None else spec_of(jid)
            if spec is None:
                self._enqueue(snap.jobs[jid], k)
            else:
                self._file(jid, spec.gpus, k)

    def _next_demotion(self, snap: Snapshot, running: Iterable[str]) -> float | None:
        """When the next of the `running` jobs crosses its queue limit (Tiresias' "job jump"
        event)."""
        best: float | None = None
        for jid in running:
            at = self._wakeup(jid, snap)
            if at is not None and (best is None or at < best):
                best = at
        return best

    def _wakeup(self, job_id: str, snap: Snapshot) -> float | None:
        """When a job crosses its queue's limit, as of `snap` (None: the bottom queue)."""
        q = self._queue[job_id]
        if q >= len(self.limits):
            return None
        return self._wakeup_of(q, *self._held(job_id, snap), snap.now)

    def _wakeup_of(self, q: int, gpus: int, attained_s: float, now: float) -> float:
        """`_wakeup` for a job in queue `q` (not the bottom one), from its GPUs and the seconds
        it has held them."""
        if self.gpu_time:
            at = now + math.ceil(self.limits[q] / gpus) - attained_s
        else:
            at = now + self.limits[q] - attained_s
        return max(at, now)  # already past it (no cycle came): demote at once

    # -- predicted crossings, where the scheduler makes running jobs' views only when read --
    def _predict(self, job_id: str, snap: Snapshot) -> None:
        """Predict a running job's demotion and wake-up as of `snap`."""
        self._unpredict(job_id)
        q = self._queue[job_id]
        if q >= len(self.limits):
            self._due[job_id] = None
            return
        gpus, attained_s = self._held(job_id, snap)
        wake = self._wakeup_of(q, gpus, attained_s, snap.now)
        rate = gpus if self.gpu_time else 1
        limit = self.limits[q] - DEMOTION_TOLERANCE
        due = snap.now + (limit - self._service(gpus, attained_s)) / rate
        self._due[job_id] = (due, wake)
        self._demotions.add((due, job_id))
        self._wakeups.add((wake, job_id))

    def _unpredict(self, job_id: str) -> None:
        if job_id in self._due:
            times = self._due.pop(job_id)
            if times is not None:
                self._demotions.remove((times[0], job_id))
                self._wakeups.remove((times[1], job_id))

    def _kept(self, snap: Snapshot, running: RunningJobs) -> None:
        """Predictions for exactly the running jobs (from their views where a job's start
        went untold, as under a policy switched to mid-run). Every stop unpredicts, so only
        running jobs are predicted: equal counts are equal sets, and a cycle pays no
        comparison of every running job."""
        if len(self._due) != len(running.ids):
            for job_id in running.ids:
                if job_id not in self._due:
                    self._predict(job_id, snap)

    def _kept_demoted(self, snap: Snapshot, running: RunningJobs) -> list[str]:
        """`_demoted`, in no order: read only the jobs predicted to cross by about now."""
        self._kept(snap, running)
        soon = takewhile(lambda entry: entry[0] <= snap.now + DRIFT_S, self._demotions)
        return [job_id for _, job_id in soon if self._crossed(job_id, *self._held(job_id, snap))]

    def _kept_wakeup(self, snap: Snapshot) -> float | None:
        """`_next_demotion` over the running jobs: read only those predicted to wake within
        twice the drift of the earliest."""
        if not self._wakeups:
            return None
        within = self._wakeups[0][0] + 2 * DRIFT_S
        soon = takewhile(lambda entry: entry[0] <= within, self._wakeups)
        return self._next_demotion(snap, (job_id for _, job_id in soon))


class Las(DiscretisedLas):
    name = "las"
    description = "Tiresias discretised LAS on attained time (dlas): MLFQ, GPU counting"
    gpu_time = False


class Tiresias(DiscretisedLas):
    name = "tiresias"
    description = "Tiresias 2D-LAS on attained GPU-time (dlas-gpu): MLFQ, limits 3250 s/7200 s"
    gpu_time = True


class TiresiasPollux(Tiresias):
    """Pollux's Tiresias+TunedJobs baseline (its simulator's `tiresias.py`): two queues, one
    demotion at 16 GPU-hours of attained service; Pollux re-plans it every 60 s
    (`--round-s 60`)."""

    name = "tiresias-pollux"
    description = "Tiresias as Pollux's simulator runs it: 2 queues, demotion at 16 GPU-hours"
    limits = (57_600.0,)
