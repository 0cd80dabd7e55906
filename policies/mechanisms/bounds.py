"""Running jobs' keys as last taken, kept sorted: bounds on their true keys.

Where a running job's key can only fall while it runs (srtf's remaining time), a key taken at
any earlier cycle bounds its key now from above. `OrderedPolicy` keeps one per running job so
that a cycle reads few running jobs' views: the last running rank is found by taking again
only the last bounds (`last`), and a full walk ranks only the jobs whose bounds reach the
first waiting job (`reaching`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

from sortedcontainers import SortedList

from policies.base import RunningJobs

__all__ = ["Key", "Rank", "RunningBounds"]

Key = tuple[Any, ...]
Rank = tuple[Key, str]  # a key and its job id: a total order over jobs
KeyOf = Callable[[str], Key]  # a running job's key now

_RETAKES = 64  # at most so many running jobs' keys taken again per check (a bound either way)
_REBUILD_FROM = 16  # the sorted ranks are made again where 1/16 of them or more change


def _none_between(waiting: list[SortedList], low: Rank | None, high: Rank) -> bool:
    """Whether no waiting job ranks between `low` and `high` (ranks of running jobs)."""
    return low is not None and all(b.bisect_left(low) == b.bisect_left(high) for b in waiting)


class RunningBounds:
    """Every running job's key as last taken (None: to be taken, as for a job that started
    since), those taken sorted by rank, and the snapshot whose reports were last taken."""

    def __init__(self) -> None:
        self._keys: dict[str, Key | None] = {}
        self._ranks: SortedList = SortedList()
        self._untaken: set[str] = set()
        self._reports_for: RunningJobs | None = None

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._keys

    def ranks(self) -> list[Rank]:
        """The bounds taken, sorted (best first)."""
        return list(self._ranks)

    @property
    def order(self) -> SortedList:
        """The bounds taken, sorted (best first), as kept: to read, never to change."""
        return self._ranks

    def keys(self) -> dict[str, Key | None]:
        """A copy of every running job's key as last taken (None: not taken yet)."""
        return dict(self._keys)

    def take(self, job_id: str, k: Key) -> None:
        """`k` is the job's key now."""
        self._unrank(job_id)
        self._keys[job_id] = k
        self._ranks.add((k, job_id))
        self._untaken.discard(job_id)

    def to_take(self, job_id: str) -> None:
        """A running job whose key is taken at the next check (a job that starts)."""
        self._unrank(job_id)
        self._keys[job_id] = None
        self._untaken.add(job_id)

    def _unrank(self, job_id: str) -> None:
        """Out of the sorted ranks, if its key was taken (it stays among the running)."""
        old = self._keys.get(job_id)
        if old is not None:
            self._ranks.remove((old, job_id))

    def drop(self, job_id: str) -> None:
        """The job no longer runs (if it did)."""
        if job_id in self._keys:
            old = self._keys.pop(job_id)
            if old is not None:
                self._ranks.remove((old, job_id))
            self._untaken.discard(job_id)

    def reset(self, ranks: list[Rank]) -> None:
        """Every running job's key as now taken (none: to be taken from the views)."""
        if ranks or self._keys:
            self._keys = {jid: k for k, jid in ranks}
            self._ranks = SortedList(ranks)
            self._untaken.clear()

    def retake(self, walked: list[Rank], run: Collection[str]) -> None:
        """The keys of running jobs a walk ranked (sorted): taken anew for those that still
        run, dropped for the others. Many of them: the sorted ranks made again, from the
        others' and theirs (two sorted runs, which a sort merges in linear time), rather
        than one removal and one insertion each."""
        if len(walked) * _REBUILD_FROM < len(self._ranks):
            for k, jid in walked:
                if jid in run:
                    self.take(jid, k)
                else:
                    self.drop(jid)
            return
        keys, ids = self._keys, set()
        for k, jid in walked:
            ids.add(jid)
            if jid in run:
                keys[jid] = k
            else:
                del keys[jid]
        self._untaken -= ids
        self._ranks = SortedList([item for item in self._ranks if item[1] not in ids]
                                 + [item for item in walked if item[1] in run])

    def take_reports(self, running: RunningJobs, key_of: KeyOf) -> None:
        """Keys taken for the jobs that started or were reported on since (a report may set
        a job back), once per snapshot; every job's, where these bounds were not told of
        every start (a policy made or switched to mid-run). Every stop drops its job's
        bound, so only running jobs have one: equal counts are equal sets."""
        if self._reports_for is running:
            return
        if len(self._keys) != len(running.ids):
            self.reset([])
            for job_id in running.ids:
                self.to_take(job_id)
        for job_id in [*self._untaken, *running.reported]:
            self.take(job_id, key_of(job_id))
        self._reports_for = running

    def last(self, waiting: list[SortedList], key_of: KeyOf) -> Rank:
        """A rank no better than the last running job's that no waiting job's (`waiting`:
        sorted ranks) falls between: all a check that compares it with waiting jobs needs.

        The last bound is taken again until it stands, or until no waiting job ranks
        between the best key so taken (no better than the true last) and the next bound (no
        worse): then either answers alike. Each one taken again leaves the sorted ranks
        (its key now exact) until the loop ends, so the next one is the better of their last
        and the best of those taken out, which stands (its key is exact) if it is theirs."""
        ranks, keys, out = self._ranks, self._keys, []
        best: Rank | None = None
        check_at = 1  # taken again so far when between is next looked at (then twice as many)
        for retaken in range(_RETAKES):
            top = ranks[-1]
            if best is not None and best > top:
                break
            if retaken == check_at:
                check_at *= 2
                if _none_between(waiting, best, top):
                    break
            now = key_of(top[1])
            if now == top[0]:
                break
            ranks.pop()
            keys[top[1]] = now
            item = (now, top[1])
            out.append(item)
            if best is None or item > best:
                best = item
            if not ranks:
                break
        ranks.update(out)
        worst: Rank = ranks[-1]
        return worst

    def reaching(self, first: Rank) -> Iterator[str]:
        """The jobs whose bounds rank at or behind `first`: those that may rank behind it."""
        ranks = self._ranks
        for _, jid in ranks.islice(ranks.bisect_left(first)):
            yield jid

    def behind(self, item: Rank) -> Iterator[str]:
        """The jobs whose bounds rank behind `item`: never fewer than those whose keys do.
        Read before the bounds change again."""
        return (jid for _, jid in self._ranks.irange(item, inclusive=(False, True)))
