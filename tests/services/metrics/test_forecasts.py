"""Start forecasts scored against the starts that followed (services/metrics/forecasts.py),
in the metrics core's summary, outside its digest, and on its Prometheus endpoint."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.events import JobTransitionV1, StartForecast, envelope
from schemas.job import JobState
from services.metrics.core import MetricsCore
from services.metrics.forecasts import ForecastScores
from services.metrics.prometheus import exposition, registry_for
from tests.builders import cluster, make_job

Q, R, P, F, X = (JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED, JobState.FINISHED,
                 JobState.FAILED)


def _fc(at: float, **starts: float | None) -> StartForecast:
    return StartForecast(at=at, cycle=1, starts=starts)


# (what happens, in order: ("forecast", at, {job: start}) | ("start", job, at) |
#  ("drop", job)), expected summary (None: no forecast made)
CASES: list[tuple[str, list[tuple[Any, ...]], dict[str, Any] | None]] = [
    ("none made", [("start", "a", 10.0)], None),
    ("exact", [("forecast", 0.0, {"a": 10.0}), ("start", "a", 10.0)],
     {"median": 0.0, "p90": 0.0, "first_median": 0.0, "jobs": 1, "forecasts": 1,
      "unforecast": 0}),
    # Every forecast of the wait counts; the first also counts on its own. Errors 30, 10, 0.
    ("every forecast of a wait", [("forecast", 0.0, {"a": 70.0}), ("forecast", 50.0, {"a": 110.0}),
                                  ("forecast", 90.0, {"a": 100.0}), ("start", "a", 100.0)],
     {"median": 10.0, "p90": 30.0, "first_median": 30.0, "first_p90": 30.0, "jobs": 1,
      "forecasts": 3, "unforecast": 0}),
    # A forecast without a time is counted apart; a wait that ends without a start is dropped.
    ("beyond the horizon, and dropped", [("forecast", 0.0, {"a": None, "b": 5.0}),
                                         ("start", "a", 500.0), ("drop", "b")],
     {"median": None, "p90": None, "jobs": 0, "forecasts": 0, "unforecast": 1}),
    # A resumption ends a wait too: the forecasts made while it was preempted score against it.
    # (Errors 10 and 20; a median of two is the upper one, as every summary figure takes it.)
    ("two waits", [("forecast", 0.0, {"a": 20.0}), ("start", "a", 10.0),
                   ("forecast", 50.0, {"a": 60.0}), ("start", "a", 80.0)],
     {"median": 20.0, "first_median": 20.0, "first_p90": 20.0, "jobs": 1, "forecasts": 2}),
]


@pytest.mark.parametrize(("events", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_scores(events: list[tuple[Any, ...]], expected: dict[str, Any] | None) -> None:
    scores = ForecastScores()
    for ev in events:
        if ev[0] == "forecast":
            scores.forecast(_fc(ev[1], **ev[2]))
        elif ev[0] == "start":
            scores.started(ev[1], ev[2])
        else:
            scores.dropped(ev[1])
    got = scores.summary()
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert {k: got[k] for k in expected} == expected


def _feed(m: MetricsCore, t: float, body: Any) -> None:
    m.handle(envelope(body, event_id=f"e{t}{id(body)}", occurred_at=t, producer="scheduler",
                      causation_id=None), t)


def _tr(job: str, state: JobState, prev: JobState | None, spec: Any = None) -> JobTransitionV1:
    return JobTransitionV1(job_id=job, state=state, previous=prev, cause="x", spec=spec)


def test_the_metrics_core_scores_forecasts_outside_its_digest() -> None:
    with_forecasts, without = MetricsCore(4), MetricsCore(4)
    a, b = make_job("a").build(), make_job("b").build()
    for m in (with_forecasts, without):
        _feed(m, 0, _tr("a", Q, None, a))
        _feed(m, 0, _tr("b", Q, None, b))
        _feed(m, 0, _tr("a", R, Q))
        if m is with_forecasts:
            _feed(m, 0, _fc(0.0, b=100.0))
        _feed(m, 90, _tr("a", F, R))
        _feed(m, 90, _tr("b", R, Q))
        _feed(m, 190, _tr("b", F, R))
    assert with_forecasts.digest == without.digest
    assert with_forecasts.decisions == without.decisions
    summary = with_forecasts.summary()["forecast_error_s"]
    assert isinstance(summary, dict)
    assert summary["median"] == 10.0 and summary["jobs"] == 1
    assert without.summary()["forecast_error_s"] is None


def test_forecast_errors_are_a_prometheus_histogram() -> None:
    m = MetricsCore(4)
    _feed(m, 0, _tr("b", Q, None, make_job("b").build()))
    _feed(m, 0, _fc(0.0, b=100.0))
    _feed(m, 130, _tr("b", R, Q))
    text = exposition(registry_for(m, cluster(1, 4)))
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "loom_start_forecast_error_seconds"]
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("loom_start_forecast_error_seconds_count", None)] == 1
    assert samples[("loom_start_forecast_error_seconds_sum", None)] == 30.0
    assert samples[("loom_start_forecast_error_seconds_bucket", "10")] == 0
    assert samples[("loom_start_forecast_error_seconds_bucket", "60")] == 1
