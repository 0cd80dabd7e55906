"""Pure accounting for the training loop: stage times, report windows, fast-forward, seeds.

Nothing here reads a clock or imports torch; the loop passes measured durations and `now` in.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from schemas.trainer import StageTimes


def derive_seed(seed: int, *path: int) -> int:
    """A 63-bit seed for one purpose (`path`) of a job's seed, e.g. (STREAM, iteration).

    Seeds of different purposes and iterations never collide the way `seed + iteration` does.
    """
    digest = hashlib.blake2b(
        b"".join(x.to_bytes(8, "little", signed=True) for x in (seed, *path)), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little") >> 1


# Purposes for derive_seed.
INIT = 1  # initial weights
WORLD = 2  # the synthetic task (class templates, Markov chain, environment)
STREAM = 3  # the batch of an iteration: derive_seed(seed, STREAM, iteration)


@dataclass(frozen=True)
class StepTimes:
    """One iteration's measured stages (seconds)."""

    data_s: float
    compute_s: float
    comm_s: float
    wall_s: float


@dataclass
class StageAccount:
    """Sums over measured iterations; `summary()` gives the per-iteration means."""

    iterations: int = 0
    data_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    wall_s: float = 0.0

    def add(self, t: StepTimes) -> None:
        self.iterations += 1
        self.data_s += t.data_s
        self.compute_s += t.compute_s
        self.comm_s += t.comm_s
        self.wall_s += t.wall_s

    def summary(self) -> StageTimes | None:
        n = self.iterations
        if n == 0:
            return None
        return StageTimes(iterations=n, data_s=self.data_s / n, compute_s=self.compute_s / n,
                          comm_s=self.comm_s / n, iteration_s=self.wall_s / n)


@dataclass
class Window:
    """What one progress record covers: iterations since the last record."""

    started_at: float
    start_iteration: int
    stages: StageAccount = field(default_factory=StageAccount)
    loss_sum: float = 0.0
    loss_count: int = 0

    def add_loss(self, loss: float) -> None:
        self.loss_sum += loss
        self.loss_count += 1

    def loss(self) -> float | None:
        return self.loss_sum / self.loss_count if self.loss_count else None

    def throughput(self, iteration: int, now: float) -> float:
        elapsed = now - self.started_at
        done = iteration - self.start_iteration
        return done / elapsed if elapsed > 0 else 0.0


@dataclass
class ReportClock:
    """A progress record is due every `every` iterations (0: never by count) and whenever
    `interval` seconds (0: never by time) have passed since the last one."""

    every: int
    interval: float
    last_iteration: int
    last_time: float

    def due(self, iteration: int, now: float) -> bool:
        if iteration <= self.last_iteration:
            return False
        if self.every and iteration - self.last_iteration >= self.every:
            return True
        return bool(self.interval) and now - self.last_time >= self.interval

    def mark(self, iteration: int, now: float) -> None:
        self.last_iteration = iteration
        self.last_time = now


@dataclass(frozen=True)
class FastForward:
    """Advance the iteration count at a measured rate without computing.

    After `--fast-forward K` measured iterations, a launch stops computing and counts
    iteration `start + j` as done at `started_at + j * iteration_s` (as the Muri testbed's
    `fast_forwarding + (t − last_finish) / real_itertime`), never beyond `total`.
    """

    start: int
    started_at: float
    iteration_s: float
    total: int

    def position(self, now: float) -> int:
        if self.iteration_s <= 0:
            return self.total
        ahead = math.floor((now - self.started_at) / self.iteration_s + 1e-9)
        return min(self.total, self.start + max(0, ahead))

    def time_of(self, iteration: int) -> float:
        """When the count reaches `iteration`."""
        return self.started_at + (iteration - self.start) * self.iteration_s
