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

# Cycles logged before every running job is charged them (the scheduler's estimates and the
# simulated nodes charge cycles lazily: see `services.scheduler.jobs` and
# `services.nodeagent.simnode`): the bound on the log. Most runs end or stop sooner.
CATCH_UP_CYCLES = 64

# Speed that changes with progress (a goodput-profiled job's epochs): (iterations done up to,
# seconds per iteration) pieces, the last open-ended. See `domain.goodput`.
Segments = tuple[tuple[float, float], ...]


@dataclass(slots=True)
class RunProgress:
    total: float  # the job's iterations
    remaining: float  # iterations left as of `at`
    at: float
    ready_at: float
    iteration_s: float
    per_event_s: float = 0.0
    segments: Segments | None = None

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
