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
from typing import ClassVar

from policies.base import Fitter, JobView, Plan, Snapshot, greedy_fill
from policies.mechanisms.ordered import Key, OrderedPolicy

# Tiresias simulator constants (jobs.py): 3 queues; only the first two limits matter.
QUEUE_LIMITS: tuple[float, ...] = (3250.0, 7200.0)
DEMOTION_TOLERANCE = 1e-6  # GPU-seconds


class DiscretisedLas(OrderedPolicy):
    placement = "count"
    gpu_time: ClassVar[bool]
    limits: ClassVar[tuple[float, ...]] = QUEUE_LIMITS

    def __init__(self) -> None:
        super().__init__()
        self._queue: dict[str, int] = {}
        self._key: dict[str, Key] = {}
        self._back = 0  # appends to the back of a queue
        self._front = 0  # preempted jobs go in front of the waiting part of their queue
        self._next_rank = 0  # above every running job's rank (see `plan_in_place`)

    def attained(self, job: JobView) -> float:
        return job.attained_gpu_s if self.gpu_time else job.attained_s

    def key(self, job: JobView) -> Key:
        return self._key[job.job_id]

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
        self._queue.pop(job_id, None)
        self._key.pop(job_id, None)

    def running_stays(self, snap: Snapshot) -> bool:
        return False  # new jobs enter queue 0, ahead of running ones: `plan_in_place` decides

    def _demoted(self, snap: Snapshot) -> list[str]:
        """Running jobs whose attained service reached their queue's limit: one level down
        this cycle (at most one, as Tiresias does)."""
        last, limits, queue = len(self.limits), self.limits, self._queue
        # Tolerance: a wake-up for the crossing can land a hair before it in floating point
        # (e.g. 3249.9999999999995 GPU-s); without it that instant would re-plan forever.
        return [job.job_id for job in snap.running
                if (q := queue[job.job_id]) < last
                and self.attained(job) >= limits[q] - DEMOTION_TOLERANCE]

    def plan_in_place(self, snap: Snapshot, fit: Fitter) -> Plan | None:
        # Without demotions every running job keeps its key, and the walk over waiting jobs
        # decides as the full walk would (OrderedPolicy.walk_in_place). Jobs that start get
        # ranks after every running job's, in walk order: the order the full walk gives them.
        if self._demoted(snap):
            return None
        plan = self.walk_in_place(snap, fit)
        if plan is None:
            return None
        for jid in plan.run:
            super().job_removed(jid)
            self._key[jid] = (self._queue[jid], 0, self._next_rank)
            self._next_rank += 1
        plan.wakeup_at = self._next_demotion(snap, [*(v.job_id for v in snap.running),
                                                    *plan.run])
        self._last = plan
        return plan

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        for jid in self._demoted(snap):
            self._append(jid, self._queue[jid] + 1)
        running = sorted((self._key[v.job_id], v.job_id) for v in snap.running)
        plan = greedy_fill(self.streams(running), snap.jobs, fit, self.name)
        for jid in plan.run:
            super().job_removed(jid)
        for rank, jid in enumerate(plan.run):  # plan.run is in walk order
            self._key[jid] = (self._queue[jid], 0, rank)
        self._next_rank = len(plan.run)
        # A preempted job keeps its place in the walk: one that ran last cycle goes in front of
        # its queue's waiting jobs; one demoted this cycle stays at the back of its new queue.
        preempted = [(k, jid) for k, jid in running if jid not in plan.run]
        for k, jid in sorted(preempted, reverse=True):
            if k[1] == 0:
                self._front -= 1
                k = (self._queue[jid], 1, self._front)
                self._key[jid] = k
            self._enqueue(snap.jobs[jid], k)
        plan.wakeup_at = self._next_demotion(snap, plan.run)
        self._last = plan
        return plan

    def _next_demotion(self, snap: Snapshot, running: Iterable[str]) -> float | None:
        """When the next of the `running` jobs crosses its queue limit (Tiresias' "job jump"
        event)."""
        best: float | None = None
        for jid in running:
            q = self._queue[jid]
            if q >= len(self.limits):
                continue
            job = snap.jobs[jid]
            if self.gpu_time:
                at = snap.now + math.ceil(self.limits[q] / job.gpus) - job.attained_s
            else:
                at = snap.now + self.limits[q] - job.attained_s
            at = max(at, snap.now)  # already past it (no cycle came): demote at once
            if best is None or at < best:
                best = at
        return best


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
