"""The policy's views of active jobs (services/scheduler/views.py): a running job's view is made
from its record when first read after a cycle accounted it, and holds what a view made at the
cycle would have held."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from domain import causes
from domain.progress import RunProgress
from schemas.job import JobState
from services.scheduler.jobs import JobRecord, JobTable
from services.scheduler.views import ActiveViews
from tests.builders import make_job


def _table() -> tuple[JobTable, ActiveViews, JobRecord, JobRecord]:
    """A table with job `r` running (10 of 100 iterations done) and job `w` waiting, and the
    views of both as a cycle left them."""
    table = JobTable()
    views = ActiveViews(table)
    running, waiting = (table.add(make_job(j).gpus(1).build(), 0.0) for j in ("r", "w"))
    for rec in (running, waiting):
        table.transition(rec, JobState.QUEUED, causes.ADMITTED, 0.0)
    running.place((("n0", (0,)),))
    table.set_running(running)
    table.transition(running, JobState.RUNNING, causes.STARTED, 0.0)
    running.run = RunProgress(total=100.0, remaining=90.0, at=0.0, ready_at=0.0,
                              iteration_s=1.0)
    running.iterations_done = 10.0
    for rec in (running, waiting):
        views.set(rec.spec.job_id, rec.view())
    return table, views, running, waiting


def _account(rec: JobRecord) -> None:
    rec.account(30.0, 0.0)  # 30 more iterations by t = 30


def _report(rec: JobRecord) -> None:
    rec.iterations_done = 5.0


Step = Callable[[ActiveViews, JobRecord], None]


@pytest.mark.parametrize(("steps", "done"), [
    pytest.param([], 10.0, id="as-set"),
    pytest.param([lambda v, r: _account(r), lambda v, r: v.outdate()], 40.0,
                 id="remade-after-a-cycle"),
    pytest.param([lambda v, r: _account(r)], 10.0, id="not-remade-within-a-cycle"),
    pytest.param([lambda v, r: _report(r)], 10.0, id="a-report-unseen-till-the-next-cycle"),
    pytest.param([lambda v, r: _account(r), lambda v, r: v.outdate(), lambda v, r: v.freeze("r"),
                  lambda v, r: _report(r)], 40.0, id="frozen-as-the-cycle-left-it"),
    pytest.param([lambda v, r: _report(r), lambda v, r: v.outdate()], 5.0,
                 id="a-report-shows-at-the-next-cycle"),
])
def test_a_running_jobs_view(steps: list[Step], done: float) -> None:
    _, views, running, _ = _table()
    for step in steps:
        step(views, running)
    assert views["r"].iterations_done == done
    assert dict(views.items())["r"] == views["r"]


def test_every_way_of_reading_sees_the_running_jobs_current_view() -> None:
    _, views, running, waiting = _table()
    _account(running)
    views.outdate()
    assert [v.iterations_done for v in views.values()] == [40.0, 0.0]
    assert list(views) == ["r", "w"] and len(views) == 2 and "w" in views
    waiting.iterations_done = 7.0  # a waiting job's view is only ever set
    views.outdate()
    assert views["w"].iterations_done == 0.0


def test_a_dropped_job_is_gone_and_an_unknown_one_raises() -> None:
    _, views, _, _ = _table()
    views.drop("w")
    assert "w" not in views and list(views) == ["r"]
    with pytest.raises(KeyError):
        views["w"]
