"""Policies that rank jobs by a key and fill the cluster greedily in that order."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import ClassVar

from sortedcontainers import SortedList

from policies.base import (
    Fitter,
    JobView,
    Plan,
    Policy,
    RunningJobs,
    Snapshot,
    running_left_of,
    running_specs,
    status_for_waiting,
)
from policies.mechanisms.bounds import Key, Rank, RunningBounds
from policies.mechanisms.walk import Stream, greedy_fill
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.status import Status

__all__ = ["Key", "OrderedPolicy", "TimeLeftOrder"]


class OrderedPolicy(Policy):
    """Rank by `key` (lower runs first); waiting jobs live in sorted indexes between cycles.

    `key` must not change while a job waits (it may change while the job runs): that is what
    lets a cycle cost O(running + placed) instead of re-sorting the whole queue. The index is
    split by GPU count, so the walk can drop every job of a size that no longer fits at once.

    While every waiting job ranks after every running one, the walk would re-place each
    running job where it is before it reached a waiting one: such a cycle is planned in place
    (`running_stays`), placing waiting jobs only. When some waiting jobs overtake running ones,
    the cycle is still planned in place if every one of them fits beside the running jobs
    (`plan_in_place`): the full walk would have placed each of them on the same free GPUs
    (placement never counts a held GPU as room for a job that displaces nobody) and then
    re-placed every running job where it is. So it is where one of them finds no GPUs, if
    it would find none in the full walk either, even displacing the running jobs behind it
    (a wide job blocked ahead of long-running ones, on a busy cluster).

    Where a running job's key never rises while it runs (`keys_fall`), the rank of the last
    running job comes from the keys as last taken, which bound the true ones from above
    (`RunningBounds`): only the last is taken again, until it stands or no waiting job ranks
    between the keys so taken and the next bound, so the check reads few running jobs' views.
    """

    tries_in_place = True
    # Whether a running job's key can only fall or stay while it runs and nothing reports on
    # it (remaining time only shrinks): then a key taken earlier is an upper bound.
    keys_fall: ClassVar[bool] = False
    # Whether a running job's key is read from its view (srtf's remaining time): the walk then
    # reads the view made for the key, else the job's spec (`RunningJobs.spec_of`).
    views_for_keys: ClassVar[bool] = True

    def __init__(self) -> None:
        self._buckets: dict[int, SortedList] = {}  # GPU count → sorted (key, job_id)
        self._wkey: dict[str, tuple[Key, int]] = {}
        self._last: Plan | None = None
        # The running jobs' ranks (unsorted) and the last of them, for one snapshot's jobs.
        self._running: tuple[Sequence[JobView], list[Rank], Rank | None] | None = None
        self._bounds = RunningBounds()  # with `keys_fall`: every running job's key as taken

    @abc.abstractmethod
    def key(self, job: JobView) -> Key: ...

    def job_added(self, job: JobView) -> None:
        self._enqueue(job, self.key(job))

    def job_removed(self, job_id: str) -> None:
        self._unqueue(job_id)
        self._bounds.drop(job_id)

    def _unqueue(self, job_id: str) -> None:
        """Out of the waiting index (if in it)."""
        entry = self._wkey.pop(job_id, None)
        if entry is not None:
            k, gpus = entry
            self._buckets[gpus].remove((k, job_id))

    def job_requeued(self, job: JobView) -> None:
        self._bounds.drop(job.job_id)
        self._enqueue(job, self.key(job))  # as `settle` does for a job preempted in a cycle

    def job_running(self, job: JobView) -> None:
        OrderedPolicy._unqueue(self, job.job_id)  # out of the waiting index, as a start
        if self.keys_fall:
            self._bounds.to_take(job.job_id)

    def _enqueue(self, job: JobView, k: Key) -> None:
        self._file(job.job_id, job.gpus, k)

    def _file(self, job_id: str, gpus: int, k: Key) -> None:
        """Into the waiting index under key `k` (`_enqueue` without a view)."""
        self._wkey[job_id] = (k, gpus)
        bucket = self._buckets.get(gpus)
        if bucket is None:
            bucket = self._buckets[gpus] = SortedList()
        bucket.add((k, job_id))

    def streams(self, running: list[Rank]) -> list[Stream]:
        return [(None, iter(running)), *self.waiting_streams()]

    def waiting_streams(self) -> list[Stream]:
        """The waiting jobs, one sorted stream per GPU count."""
        return [(g, iter(b)) for g, b in self._buckets.items() if b]

    def running_keys(self, snap: Snapshot) -> list[Rank]:
        keys = self._keys_of(snap)
        keys.sort()
        return keys

    def _keys_of(self, snap: Snapshot) -> list[Rank]:
        """The running jobs' ranks, unsorted; computed once per snapshot (`running_stays`,
        `plan_in_place` and a full walk all need them)."""
        return self._ranked(snap)[1]

    def _worst(self, snap: Snapshot) -> Rank:
        """The last running job's rank (there is one), once per snapshot; with `keys_fall`,
        a rank no better than it that no waiting job's falls between, which is all the
        checks need: they compare it with waiting jobs' ranks alone."""
        # Bounded where the scheduler makes running jobs' views only when read (many run).
        if self.keys_fall and isinstance(snap.running, RunningJobs):
            return self._bound(snap, snap.running)
        worst = self._ranked(snap)[2]
        assert worst is not None
        return worst

    def _bound(self, snap: Snapshot, running: RunningJobs) -> Rank:
        """`_worst` from the bounds: `RunningBounds.last`."""
        key_of = self._key_of(snap)
        self._bounds.take_reports(running, key_of)
        return self._bounds.last([b for b in self._buckets.values() if b], key_of)

    def _key_of(self, snap: Snapshot) -> Callable[[str], Key]:
        """A running job's key now, in this snapshot (a walk reads a thousand: a policy with a
        cheaper way to them than `running_key` one by one returns that)."""
        return lambda job_id: self.running_key(job_id, snap)

    def running_key(self, job_id: str, snap: Snapshot) -> Key:
        """A running job's key now (a policy that keeps them need not read its view)."""
        return self.key(snap.jobs[job_id])

    def _ranked(self, snap: Snapshot) -> tuple[Sequence[JobView], list[Rank],
                                               Rank | None]:
        cached = self._running
        if cached is None or cached[0] is not snap.running:
            keys = [(self.key(v), v.job_id) for v in snap.running]
            cached = self._running = (snap.running, keys, max(keys) if keys else None)
        return cached

    def running_stays(self, snap: Snapshot) -> bool:
        # Exact for the plain walk below; a subclass that plans otherwise says False (Tiresias).
        heads = [b[0] for b in self._buckets.values() if b]
        if not heads or not snap.running:
            return True
        return bool(self._worst(snap) < min(heads))

    def plan_in_place(self, snap: Snapshot, fit: Fitter) -> Plan | None:
        plan = self.walk_in_place(snap, fit)
        if plan is not None:
            self.settle(snap, plan, [])
            self._last = plan
        return plan

    def walk_in_place(self, snap: Snapshot, fit: Fitter) -> Plan | None:
        """The walk over waiting jobs only, if it decides as the full walk would: every
        waiting job that ranks ahead of a running one either finds GPUs beside them, or would
        find none in the full walk either (`_left_out_alike`); else None. Changes no index."""
        worst = self._worst(snap)
        # Per GPU count, how many waiting jobs rank ahead of the last running one.
        ahead = [(gpus, bucket, bucket.bisect_left(worst))
                 for gpus, bucket in self._buckets.items()]
        proves = fit.monotone and fit.fails_by_size  # see `_left_out_alike`
        if not proves and sum(gpus * n for gpus, _, n in ahead) > fit.free_gpus:
            return None  # they cannot all fit: some would displace running jobs, or wait
        plan = greedy_fill(self.streams([]), snap.jobs, fit, self.name)
        left_out = []
        for gpus, bucket, n in ahead:  # the first left out of each size: see `_left_out_alike`
            item = next((it for it in bucket.islice(0, n) if it[1] not in plan.run), None)
            if item is not None:
                left_out.append((item, gpus))
        if left_out and not (proves and self._left_out_alike(snap, fit, left_out)):
            return None
        plan.stay = True
        return plan

    def _left_out_alike(self, snap: Snapshot, fit: Fitter,
                        left_out: list[tuple[Rank, int]]) -> bool:
        """Whether the full walk would leave out these waiting jobs too (the first of each GPU
        count left out ahead of the last running job), and so keep every running job where it
        is. A job left out there fails even where it may displace the running jobs behind it,
        or comes after a gang no wider that failed: a monotone fit then skips it, and every
        later job as wide, in either walk."""
        smallest = None
        for item, gpus in sorted(left_out):
            if smallest is not None and gpus >= smallest:
                continue
            if not fit.blocked_displacing(gpus, self._behind(snap, item)):
                return False
            smallest = gpus
        return True

    def _behind(self, snap: Snapshot, item: Rank) -> Iterator[str]:
        """The running jobs that may rank after `item` (with bounded keys, some that may
        not: never fewer), as read: the placement stops at the first that settles it."""
        if self.keys_fall and isinstance(snap.running, RunningJobs):
            return self._bounds.behind(item)
        return (jid for k, jid in self._keys_of(snap) if (k, jid) > item)

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        if snap.in_place:
            plan = greedy_fill(self.streams([]), snap.jobs, fit, self.name)
            plan.stay = True
            self.settle(snap, plan, [])
        else:
            spec_of = None if self.views_for_keys else running_specs(snap)
            walked, running = self._behind_first(snap), snap.running
            if (walked is not None and isinstance(running, RunningJobs)
                    and fit.stay_all_but(running.ids, {jid for _, jid in walked})):
                # Those ahead stay where they run, unlisted: the plan lists what it walks.
                plan = greedy_fill(self.streams(walked), snap.jobs, fit, self.name, None,
                                   spec_of)
                plan.stay = True
                plan.preempted = {jid for _, jid in walked if jid not in plan.run}
                self.settle(snap, plan, walked, every=False)
            else:
                ranked = self.running_keys(snap)
                plan = greedy_fill(self.streams(ranked), snap.jobs, fit, self.name, None,
                                   spec_of)
                self.settle(snap, plan, ranked)
        self._last = plan
        return plan

    def _walk_start(self, snap: Snapshot, fit: Fitter
                    ) -> tuple[dict[str, GpuSlots], list[Rank]]:
        """A full walk's start: the running jobs that rank ahead of every waiting job, given
        back their GPUs at once (the walk would re-place each where it is before it reached
        a waiting job), and the other running jobs' ranks, sorted (`_behind_first`); else
        none kept and every running job ranked."""
        walked, running = self._behind_first(snap), snap.running
        if walked is not None and isinstance(running, RunningJobs):
            kept = fit.keep_all_but(running.ids, {jid for _, jid in walked})
            if kept is not None:
                return kept, walked
        return {}, self.running_keys(snap)

    def _behind_first(self, snap: Snapshot) -> list[Rank] | None:
        """The ranks, sorted, of the running jobs that rank behind the first waiting job: the
        others a full walk would re-place where they run before it reached a waiting job.
        With bounded keys a job whose bound ranks ahead is known to be ahead without its
        key. None where every running job is to be ranked and walked: keys not bounded, no
        waiting job, or a job that may not simply get its GPUs back (`RunningJobs.irregular`)
        ahead, since the walk's state when it reaches that job depends on which of those
        before it it has re-placed."""
        running = snap.running
        heads = [b[0] for b in self._buckets.values() if b]
        if not (heads and self.keys_fall and isinstance(running, RunningJobs) and running.ids):
            return None
        key_of = self._key_of(snap)
        self._bounds.take_reports(running, key_of)
        first, irregular = min(heads), running.irregular
        ranked: list[Rank] = []
        for jid in self._bounds.reaching(first):
            item = (key_of(jid), jid)
            if item >= first:
                ranked.append(item)
        if irregular:
            walked = {jid for _, jid in ranked}
            if any(jid not in walked for jid in irregular):
                return None
        ranked.sort()
        return ranked

    def settle(self, snap: Snapshot, plan: Plan, running: list[Rank],
               every: bool = True) -> None:
        """Move started jobs out of the waiting index and preempted ones into it; `running`:
        the running jobs the walk ranked (`every` one, or those not kept ahead)."""
        for jid in islice(plan.run, plan.kept, None):  # those kept ahead were not queued
            self._unqueue(jid)
        for _, jid in running:
            if jid not in plan.run:
                job = snap.jobs[jid]
                self._enqueue(job, self.key(job))
        if self.keys_fall and isinstance(snap.running, RunningJobs):
            self._keep_taken(plan, running, every)
        else:  # not needed: rebuilt from the views when next needed
            self._bounds.reset([])

    def _keep_taken(self, plan: Plan, running: list[Rank], every: bool) -> None:
        """The running jobs' keys after a plan: a full walk took the key of every running job
        it ranked (the others, kept ahead, keep their bounds), and the jobs that start have
        theirs taken at the next check (a job's first estimate starts from its last report,
        which its waiting key may not know)."""
        bounds = self._bounds
        if plan.stay and not running:  # in place: no running job walked
            pass
        elif every:
            bounds.reset([(k, jid) for k, jid in running if jid in plan.run])
        else:
            bounds.retake(running, plan.run)
        for jid in islice(plan.run, plan.kept, None):  # those kept ahead keep theirs
            if jid not in bounds:
                bounds.to_take(jid)

    def queue_position(self, job_id: str) -> int | None:
        """1-based rank among waiting jobs (what `loom status` shows)."""
        entry = self._wkey.get(job_id)
        if entry is None:
            return None
        item = (entry[0], job_id)
        return 1 + sum(int(b.bisect_left(item)) for b in self._buckets.values())

    def waiting_status(self, job_id: str) -> Status:
        entry = self._wkey.get(job_id)
        gpus = entry[1] if entry is not None else 0
        return status_for_waiting(job_id, gpus, self._last, self.queue_position(job_id),
                                  self.name)


class TimeLeftOrder(OrderedPolicy):
    """An order by a key made of a job's spec and the seconds it has left (srtf, srsf). Time
    left only falls while a job runs (`keys_fall`), and a running job's is read from its
    record (`RunningJobs.left_of`, the view's arithmetic), so a walk makes no views."""

    keys_fall = True
    views_for_keys = False

    @abc.abstractmethod
    def key_left(self, spec: JobSpec, left_s: float) -> Key: ...

    def key(self, job: JobView) -> Key:
        return self.key_left(job.spec, job.remaining_s)

    def running_key(self, job_id: str, snap: Snapshot) -> Key:
        return self._key_of(snap)(job_id)

    def _key_of(self, snap: Snapshot) -> Callable[[str], Key]:
        left_of = running_left_of(snap)
        if left_of is None:  # no view-free progress: from the view, as every policy
            return lambda job_id: self.key(snap.jobs[job_id])
        key_left = self.key_left

        def key(job_id: str) -> Key:
            return key_left(*left_of(job_id))
        return key
