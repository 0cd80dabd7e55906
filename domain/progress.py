"""A run's progress between reports: the one estimator the simulated node agent accounts
with, the scheduler estimates with, and `loom status` shows.

A run starts making progress at `ready_at` (after its restart overhead), at `iteration_s` per
iteration (or by `segments`, for a job whose speed changes with progress), and loses
`per_event_s` at every scheduling event that interrupts it. Since the node agent and the
scheduler use the same arithmetic, a simulation's estimate is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from domain.compiled import mypyc_attr

# Cycles logged before every running job is charged them (the scheduler's estimates and the
# simulated nodes charge cycles lazily: see `services.scheduler.jobs` and
# `services.nodeagent.simnode`): the bound on the log. Most runs end or stop sooner. A batch
# costs a little per job and less per job and cycle, so a longer log costs less in all while
# its arrays (jobs x cycles) stay small beside the run's memory.
CATCH_UP_CYCLES = 256

# Speed that changes with progress (a goodput-profiled job's epochs): (iterations done up to,
# seconds per iteration) pieces, the last open-ended. See `domain.goodput`.
Segments = tuple[tuple[float, float], ...]


@mypyc_attr(allow_interpreted_subclasses=True)  # copyable: forecasts fork the state
@dataclass(slots=True, init=False)  # a written __init__ compiles (see services.runtime.effects)
class RunProgress:
    total: float  # the job's iterations
    remaining: float  # iterations left as of `at`
    at: float
    ready_at: float
    iteration_s: float
    per_event_s: float
    segments: Segments | None

    def __init__(self, total: float, remaining: float, at: float, ready_at: float,
                 iteration_s: float, per_event_s: float = 0.0,
                 segments: Segments | None = None) -> None:
        self.total = total
        self.remaining = remaining
        self.at = at
        self.ready_at = ready_at
        self.iteration_s = iteration_s
        self.per_event_s = per_event_s
        self.segments = segments

    def left_at(self, now: float, lost_s: float = 0.0) -> float:
        """Iterations left at `now`, losing `lost_s` on the way: progress starts at
        `ready_at`, and an interval shorter than `lost_s` makes none (never negative)."""
        if self.segments is not None:
            return advance_segments(self.remaining, self.total, self.at, self.ready_at, now,
                                    self.segments, lost_s)
        last, ready_at = self.at, self.ready_at
        useful = now - (last if last > ready_at else ready_at) - lost_s
        return self.remaining - useful / self.iteration_s if useful > 0 else self.remaining

    def advance(self, now: float, lost_s: float) -> None:
        """Account the run up to `now`."""
        self.remaining = self.left_at(now, lost_s)
        self.at = now

    def charge(self, times: Sequence[float], start: int, lost_s: float) -> None:
        """`advance(t, lost_s)` at each `t` of `times[start:]`, in order: the cycles a run
        is charged late (see `CATCH_UP_CYCLES`). The same operations as `left_at`, in a loop
        without its calls: many runs are charged many cycles."""
        if self.segments is not None:
            for i in range(start, len(times)):
                self.advance(times[i], lost_s)
            return
        remaining, last, ready_at, per = self.remaining, self.at, self.ready_at, self.iteration_s
        for i in range(start, len(times)):
            now = times[i]
            useful = now - (last if last > ready_at else ready_at) - lost_s
            if useful > 0:
                remaining = remaining - useful / per
            last = now
        self.remaining, self.at = remaining, last

    def finish_at(self, now: float, upto: float | None = None) -> float:
        """When the run completes (with `upto`: reaches that many iterations done, a mark
        short of the end) if nothing interrupts it from `now` on."""
        start = now if now > self.ready_at else self.ready_at
        left = self.left_at(now) if now > self.at else self.remaining
        total = self.total
        if upto is not None:
            # Reaching `upto` is finishing a job of `upto` iterations that has as many done.
            left -= total - upto
            total = upto
        left = left if left > 0.0 else 0.0
        if self.segments is not None:
            return start + seconds_to_finish(left, total, self.segments)
        return start + left * self.iteration_s


# Below this many (run, cycle) charges a batch is charged run by run: numpy's fixed cost per
# call outweighs the loop's.
_BATCH_MIN = 512


def charge_many(runs: Sequence[tuple[RunProgress, int]], times: Sequence[float]) -> None:
    """`run.charge(times, start, run.per_event_s)` for each `(run, start)`, the runs at a
    constant speed as one array computation. Bit for bit the loop's result: the same IEEE
    operations on each run in the same order (`np.subtract.accumulate` subtracts along a
    row one after another), and an interval the loop skips subtracts 0.0, which changes no
    value."""
    flat = [(run, start) for run, start in runs if run.segments is None and start < len(times)]
    # Only the cycles some run still owes: most were charged at the last batch.
    first = min((start for _, start in flat), default=len(times))
    if not flat or len(flat) * (len(times) - first) < _BATCH_MIN:
        for run, start in runs:
            run.charge(times, start, run.per_event_s)
        return
    for run, start in runs:
        if run.segments is not None:
            run.charge(times, start, run.per_event_s)
    t = np.asarray(times[first:], dtype=np.float64)
    n, k = len(t), len(flat)
    starts = np.fromiter((start - first for _, start in flat), dtype=np.intp, count=k)
    at, ready_at, lost_s, remaining, iteration_s = (
        column[:, None] for column in np.array([_FIELDS(run) for run, _ in flat]).T)
    # The interval each cycle closes starts at the previous cycle, or the run's last charge.
    last = np.empty((k, n))
    last[:, 0] = t[0]  # (read only where a run starts later: masked below)
    last[:, 1:] = t[:-1]
    last[np.arange(k), starts] = at[:, 0]
    useful = (t - np.maximum(last, ready_at)) - lost_s
    useful[np.arange(n) < starts[:, None]] = 0.0  # before the run's first cycle: nothing
    steps = np.zeros((k, n + 1))  # what is left, then what each cycle takes off it
    steps[:, 0] = remaining[:, 0]
    np.divide(useful, iteration_s, out=steps[:, 1:], where=useful > 0)
    left: list[float] = np.subtract.accumulate(steps, axis=1)[:, -1].tolist()
    end = float(times[-1])
    for (run, _), value in zip(flat, left, strict=True):
        run.remaining, run.at = value, end


_FIELDS = attrgetter("at", "ready_at", "per_event_s", "remaining", "iteration_s")


def attained_many(attained: Sequence[tuple[float, float, int]],
                  times: Sequence[float]) -> list[float]:
    """For each (attained seconds, last accounted, start): the attained seconds after adding
    each interval up to the cycles `times[start:]` in order, as `JobRecord.catch_up` adds
    them one by one (`np.add.accumulate` adds along a row one after another; adding 0.0
    before the first cycle changes no sum that is not -0.0, and none is)."""
    n = len(times)
    first = min((start for _, _, start in attained), default=n)
    if not attained or len(attained) * (n - first) < _BATCH_MIN:
        out = []
        for total, last, start in attained:
            for i in range(start, n):
                total += times[i] - last
                last = times[i]
            out.append(total)
        return out
    t = np.asarray(times[first:], dtype=np.float64)
    n, k = len(t), len(attained)
    rows = np.arange(k)
    totals, lasts, starts = np.array(attained, dtype=np.float64).T
    starts = starts.astype(np.intp) - first
    steps = np.zeros((k, n + 1))
    steps[:, 0] = totals
    steps[:, 2:] = t[1:] - t[:-1]
    inside = starts < n
    steps[rows[inside], starts[inside] + 1] = t[starts[inside]] - lasts[inside]
    steps[:, 1:][np.arange(n) < starts[:, None]] = 0.0
    sums: list[float] = np.add.accumulate(steps, axis=1)[:, -1].tolist()
    return sums


def advance_segments(remaining: float, total: float, last: float, ready_at: float, now: float,
                     segments: Segments, lost_s: float) -> float:
    """`RunProgress.left_at` for a job whose speed changes with progress (`segments`)."""
    useful = now - (last if last > ready_at else ready_at) - lost_s
    if useful <= 0:
        return remaining
    done = total - remaining
    for upto, per in segments:
        if done >= upto:
            continue
        need = (upto - done) * per
        if need >= useful:
            done += useful / per
            break
        useful -= need
        done = upto
    return total - done


def seconds_to_finish(remaining: float, total: float, segments: Segments) -> float:
    """Running time a job with progress-dependent speed needs for `remaining` iterations."""
    done = total - remaining
    seconds = 0.0
    for upto, per in segments:
        if done >= upto:
            continue
        end = min(upto, total)
        seconds += (end - done) * per
        done = end
        if done >= total:
            break
    return seconds


def iterations_left(iterations: float, done: float) -> float:
    """Iterations a job has left, never below zero (a run may overshoot its last)."""
    left = iterations - done
    return 0.0 if left < 0.0 else left
