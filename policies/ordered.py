"""Policies that rank jobs by a key and fill the cluster greedily in that order."""

from __future__ import annotations

import abc
import heapq
from typing import Any

from sortedcontainers import SortedList

from policies.base import (
    Fitter,
    JobView,
    Plan,
    Policy,
    Snapshot,
    greedy_fill,
    status_for_waiting,
)
from schemas.status import Status

Key = tuple[Any, ...]


class OrderedPolicy(Policy):
    """Rank by `key` (lower runs first); waiting jobs live in a sorted index between cycles.

    `key` must not change while a job waits (it may change while the job runs): that is what
    lets a cycle cost O(running + placed) instead of re-sorting the whole queue.
    """

    def __init__(self) -> None:
        self._waiting: SortedList = SortedList()  # (key, job_id)
        self._wkey: dict[str, Key] = {}
        self._last: Plan | None = None

    @abc.abstractmethod
    def key(self, job: JobView) -> Key: ...

    def job_added(self, job: JobView) -> None:
        self._enqueue(job.job_id, self.key(job))

    def job_removed(self, job_id: str) -> None:
        k = self._wkey.pop(job_id, None)
        if k is not None:
            self._waiting.remove((k, job_id))

    def _enqueue(self, job_id: str, k: Key) -> None:
        self._wkey[job_id] = k
        self._waiting.add((k, job_id))

    def running_keys(self, snap: Snapshot) -> list[tuple[Key, str]]:
        return sorted((self.key(v), v.job_id) for v in snap.running)

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        jobs = snap.jobs
        running = self.running_keys(snap)
        order = (jobs[jid] for _, jid in heapq.merge(running, self._waiting))
        plan = greedy_fill(order, fit, snap.all_sizes(), self.name)
        self.settle(snap, plan, running)
        self._last = plan
        return plan

    def settle(self, snap: Snapshot, plan: Plan, running: list[tuple[Key, str]]) -> None:
        """Move started jobs out of the waiting index and preempted ones into it."""
        for jid in plan.run:
            self.job_removed(jid)
        for _, jid in running:
            if jid not in plan.run:
                self._enqueue(jid, self.key(snap.jobs[jid]))

    def queue_position(self, job_id: str) -> int | None:
        k = self._wkey.get(job_id)
        return None if k is None else self._waiting.index((k, job_id)) + 1

    def waiting_status(self, job_id: str) -> Status:
        return status_for_waiting(job_id, self._last, self.queue_position(job_id), self.name)
