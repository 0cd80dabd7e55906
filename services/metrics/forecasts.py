"""How far the scheduler's start forecasts were from the starts that followed.

Every forecast made while a job waited counts once: when the job next starts (its first
start, or its resumption after a preemption), each forecast of that wait is scored by
|forecast − actual start|. A forecast with no time (the job started beyond the forecast's
horizon) is counted apart, as `unforecast`; so are the forecasts of a wait that ended
otherwise (the job cancelled or rejected): those are dropped. `first_*` scores only the first
forecast of each wait, the one its submitter saw first.
"""

from __future__ import annotations

from array import array

from schemas.events import StartForecast


def percentile(sorted_values: list[float], q: float) -> float:
    """Muri's calc.py convention, as every summary figure: sorted[floor(q·n)], clamped."""
    n = len(sorted_values)
    return sorted_values[min(n - 1, int(q * n))]


class ForecastScores:
    """Open forecasts per waiting job, and the errors of those whose jobs have started."""

    def __init__(self) -> None:
        self._open: dict[str, list[float | None]] = {}  # job → forecasts of its current wait
        self.errors = array("d")  # seconds, one per scored forecast (compact: a long run
        self.first_errors = array("d")  # with frequent forecasts makes millions)
        self.jobs: set[str] = set()  # jobs with at least one scored forecast
        self.unforecast = 0  # forecasts without a time, of waits that ended in a start
        self.made = 0  # forecasts received (job entries, every part)

    def forecast(self, body: StartForecast) -> None:
        for job_id, start in body.starts.items():
            self._open.setdefault(job_id, []).append(start)
        self.made += len(body.starts)

    def started(self, job_id: str, at: float) -> None:
        """The job (re)started at `at`: score the forecasts of the wait this ends."""
        made = self._open.pop(job_id, None)
        if not made:
            return
        first = True
        for start in made:
            if start is None:
                self.unforecast += 1
                continue
            error = abs(start - at)
            self.errors.append(error)
            if first:
                self.first_errors.append(error)
                first = False
        if not first:
            self.jobs.add(job_id)

    def dropped(self, job_id: str) -> None:
        """The job left without starting again (cancelled, rejected, failed)."""
        self._open.pop(job_id, None)

    def summary(self) -> dict[str, float | int | None] | None:
        """Median and p90 of the errors (seconds), over every scored forecast and over the
        first of each wait; None when no forecast was made."""
        if not self.made:
            return None
        errors, first = sorted(self.errors), sorted(self.first_errors)
        return {
            "median": percentile(errors, 0.5) if errors else None,
            "p90": percentile(errors, 0.9) if errors else None,
            "mean": sum(errors) / len(errors) if errors else None,
            "first_median": percentile(first, 0.5) if first else None,
            "first_p90": percentile(first, 0.9) if first else None,
            "jobs": len(self.jobs),
            "forecasts": len(errors),
            "unforecast": self.unforecast,
        }
