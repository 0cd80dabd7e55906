"""The pieces of `report.html`: thinned CDFs, job-size buckets, axis ticks, durations, and
a page from hand-made runs (no simulation)."""

from __future__ import annotations

import pytest

from loom.html_report import CellData, TraceSection, cell_data, render, size_bucket
from loom.report_charts import duration, nice_ticks, thin_cdf
from schemas.job import JobState
from services.metrics.outcomes import JobOutcome


@pytest.mark.parametrize(("gpus", "bucket"), [
    (1, (1, 1)), (2, (2, 2)), (3, (3, 4)), (4, (3, 4)), (5, (5, 8)), (8, (5, 8)),
    (9, (9, 16)), (64, (33, 64)), (65, (65, 128)), (1024, (513, 1024)),
])
def test_size_buckets(gpus: int, bucket: tuple[int, int]) -> None:
    assert size_bucket(gpus) == bucket


@pytest.mark.parametrize(("n", "points"), [(0, 0), (1, 1), (400, 400), (100_000, 401)])
def test_a_cdf_keeps_its_ends_and_at_most_points_plus_one(n: int, points: int) -> None:
    values = [float(i + 1) for i in range(n)]
    cdf = thin_cdf(values)
    assert len(cdf) == points
    if n:
        assert cdf[0] == (1.0, 1 / n) and cdf[-1] == (float(n), 1.0)
        assert [x for x, _ in cdf] == sorted(x for x, _ in cdf)


@pytest.mark.parametrize(("lo", "hi"), [(0, 8.5), (0, 1), (0, 1e-9), (3, 97), (0, 1234567)])
def test_ticks_cover_the_range(lo: float, hi: float) -> None:
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 12


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "—"), (9, "9 s"), (119, "119 s"), (150, "2.5 min"), (7200, "2.0 h"),
    (200000, "2.3 d"), (9e6, "104 d"),
])
def test_durations(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def _job(i: int, gpus: int, tenant: str, start: float | None, end: float | None
         ) -> JobOutcome:
    state = JobState.FINISHED if end is not None else JobState.REJECTED
    return JobOutcome(f"j{i}", tenant, "resnet50", gpus, float(i), None, False, state,
                      start_s=start, end_s=end)


def test_a_cell_from_outcomes() -> None:
    jobs = [_job(0, 1, "a", 0, 10), _job(1, 2, "b", 5, 20), _job(2, 4, "a", 8, 30),
            _job(3, 64, "b", None, None)]
    summary: dict[str, object] = {"policy": "fifo", "tenants": {
        "a": {"gpu_s": 90.0, "avg_jct_s": 19.0, "finished": 2},
        "b": {"gpu_s": 30.0, "avg_jct_s": 19.0, "finished": 1}}}
    cell = cell_data(summary, jobs, [(0.0, 0.5), (16.0, 0.25)])
    assert cell.finished == 3 and [x for x, _ in cell.cdf] == [10.0, 19.0, 28.0]
    assert [(w.label, w.jobs, w.started, w.mean_s) for w in cell.waits] == [
        ("1", 1, 1, 0.0), ("2", 1, 1, 4.0), ("3–4", 1, 1, 6.0), ("33–64", 1, 0, None)]
    assert cell.tenant_gpu_s == {"a": 90.0, "b": 30.0}


def test_a_page_escapes_what_it_is_given() -> None:
    cell = CellData(policy="<fifo>", summary={"policy": "<fifo>", "jobs": 1}, finished=0,
                    cdf=(), waits=(), utilisation=(), tenant_gpu_s={})
    page = render([TraceSection(label="a&b<script>", title="t", cells=(cell,), anchor="t1")],
                  ["<fifo>"], command="loom compare --traces 'a&b<script>'")
    assert "<script>" not in page and "a&amp;b&lt;script&gt;" in page
    assert "no job finished" in page and "no job started" in page
