"""The metrics service's utilisation series: bounded, exact GPU-seconds per bin, and fed by
the same transitions as `busy_gpu_s` without touching the decision digest."""

from __future__ import annotations

import pytest

from schemas.events import JobTransitionV1, envelope
from schemas.job import JobState
from services.metrics.core import MetricsCore
from services.metrics.usage_series import UsageSeries
from tests.builders import make_job


@pytest.mark.parametrize(("intervals", "width", "max_bins", "expected"), [
    # (start, end, GPUs) added in order -> (bin start, busy fraction of 4 GPUs) up to the end
    ([(0, 2, 4)], 1.0, 8, [(0.0, 1.0), (1.0, 1.0)]),
    ([(0.5, 1.5, 2)], 1.0, 8, [(0.5, 0.5)]),  # bins start at the first busy moment
    ([(0, 1, 4), (1, 3, 2), (3, 4, 0)], 1.0, 8, [(0, 1.0), (1, 0.5), (2, 0.5), (3, 0.0)]),
    # past 4 bins of 1 s, pairs merge: 2 s bins, then 4 s bins
    # (the last bin, 6 to 7, is over its 1 s before the end)
    ([(0, 1, 4), (1, 6, 0), (6, 7, 4)], 1.0, 4, [(0.0, 0.5), (2.0, 0.0), (4.0, 0.0),
                                                 (6.0, 1.0)]),
    ([(0, 3, 4), (10, 12, 4)], 1.0, 4, [(0.0, 0.75), (4.0, 0.0), (8.0, 0.5)]),
])
def test_bins_hold_exact_gpu_seconds(intervals: list[tuple[float, float, int]], width: float,
                                     max_bins: int, expected: list[tuple[float, float]]) -> None:
    series = UsageSeries(width, max_bins)
    for start, end, gpus in intervals:
        series.add(start, end, gpus)
    end = max(e for _, e, _ in intervals)
    points = series.utilisation(4, end)
    assert [t for t, _ in points] == pytest.approx([t for t, _ in expected])
    assert [f for _, f in points] == pytest.approx([f for _, f in expected])


def test_a_long_run_keeps_at_most_max_bins_and_every_gpu_second() -> None:
    series = UsageSeries(1.0, 64)
    total = 0.0
    for k in range(5000):  # 5,000 intervals over about 40 hours
        start, gpus = k * 29.0, 1 + k % 8
        series.add(start, start + 17.0, gpus)
        total += gpus * 17.0
    assert len(series.bins) <= 64 and sum(series.bins) == pytest.approx(total)
    points = series.utilisation(8, 5000 * 29.0)
    assert 32 <= len(points) <= 64
    width = points[1][0] - points[0][0]
    busy = sum(f * 8 * min(width, 5000 * 29.0 - t) for t, f in points)
    assert busy == pytest.approx(total)


def test_an_idle_tail_is_drawn_at_zero() -> None:
    series = UsageSeries(1.0, 4)
    series.add(0, 2, 1)
    points = series.utilisation(1, 100.0)
    assert len(points) <= 4 and points[-1][1] == 0.0 and points[-1][0] < 100.0


def test_bad_series_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="positive width"):
        UsageSeries(0.0)


def _feed(m: MetricsCore, t: float, body: JobTransitionV1) -> None:
    m.handle(envelope(body, event_id=f"e{t}{id(body)}", occurred_at=t, producer="scheduler",
                      causation_id=None), t)


def test_the_core_integrates_the_same_gpu_seconds_and_the_same_digest() -> None:
    Q, R, F = JobState.QUEUED, JobState.RUNNING, JobState.FINISHED
    plain, watched = MetricsCore(4), MetricsCore(4)
    a = make_job("a").gpus(2).submit(0).build()
    b = make_job("b").gpus(4).submit(5).build()
    script = [(0, JobTransitionV1(job_id="a", state=Q, previous=None, cause="x", spec=a)),
              (0, JobTransitionV1(job_id="a", state=R, previous=Q, cause="x")),
              (5, JobTransitionV1(job_id="b", state=Q, previous=None, cause="x", spec=b)),
              (10, JobTransitionV1(job_id="a", state=F, previous=R, cause="x")),
              (10, JobTransitionV1(job_id="b", state=R, previous=Q, cause="x"))]
    for t, body in script:
        _feed(plain, t, body)
        _feed(watched, t, body)
    # b still runs at 15: it counts up to then, without changing the core
    points = watched.utilisation_over_time(15.0)
    width = points[1][0] - points[0][0]
    assert sum(f * 4 * width for _, f in points) == pytest.approx(2 * 10 + 4 * 5)
    assert watched.busy_gpu_s == 2 * 10  # nothing integrated past the last transition
    assert watched.digest == plain.digest
