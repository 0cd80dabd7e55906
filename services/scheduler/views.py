"""What the policy sees of the active jobs: one view each, a running job's made when first read
after the cycle that accounted it.

A running job's progress is accounted at every cycle, so its view changes every cycle; most
cycles read few of them (an in-place cycle reads none), so none is made before it is read. A
view made late holds what the eager one would: the record changes only where its view is set
or frozen first (`set`, `freeze`).
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from types import MappingProxyType

from policies.base import JobView
from services.scheduler.jobs import JobRecord, JobTable


class ActiveViews(Mapping[str, JobView]):
    """Views by job id (admission order): every active job not held back."""

    __slots__ = ("_fresh", "_jobs", "_running", "_views")

    def __init__(self, jobs: JobTable) -> None:
        self._views: dict[str, JobView] = {}
        self._jobs = jobs
        self._running = jobs.running  # read only
        self._fresh: set[str] = set()  # running jobs whose view is up to date

    def __getitem__(self, job_id: str) -> JobView:
        view = self._views[job_id]
        if job_id in self._fresh:
            return view
        rec = self._running.get(job_id)
        if rec is None:
            return view
        self._jobs.sync(rec)
        view = self._views[job_id] = rec.view()
        self._fresh.add(job_id)
        return view

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._views

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def values(self) -> ValuesView[JobView]:
        self.refresh()
        return self._views.values()

    def items(self) -> ItemsView[str, JobView]:
        self.refresh()
        return self._views.items()

    def make_running(self, recs: Iterable[JobRecord]) -> tuple[JobView, ...]:
        """These running jobs' views, made now where not up to date, in their order."""
        views, fresh = self._views, self._fresh
        recs = list(recs)
        self._jobs.sync_many([rec for rec in recs if rec.spec.job_id not in fresh])
        made = []
        for rec in recs:
            job_id = rec.spec.job_id
            if job_id in fresh:
                made.append(views[job_id])
                continue
            view = views[job_id] = rec.view()
            fresh.add(job_id)
            made.append(view)
        return tuple(made)

    def plain(self) -> Mapping[str, JobView]:
        """The views as they are, read at C speed without this mapping's checks: for a
        cycle that has made every running job's view (`make_running`)."""
        return MappingProxyType(self._views)

    def set(self, job_id: str, view: JobView) -> None:
        """A job's view, made now from its record (shown, started, stopped)."""
        self._views[job_id] = view
        self._fresh.add(job_id)

    def drop(self, job_id: str) -> None:
        del self._views[job_id]
        self._fresh.discard(job_id)

    def outdate(self) -> None:
        """Every running job was accounted anew (a cycle): its view is made when next read."""
        self._fresh = set()

    def freeze(self, job_id: str) -> None:
        """Make a running job's view now, before its record changes outside a cycle (a
        node's report), so the policy sees what it would have seen."""
        if job_id in self._views:
            self.__getitem__(job_id)

    def refresh(self) -> None:
        """Make every running job's view that is not up to date."""
        views = self._views
        self.make_running(rec for job_id, rec in self._running.items() if job_id in views)
