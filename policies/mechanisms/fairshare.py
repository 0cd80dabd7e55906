"""Fair share over time: each queue's GPU usage, decayed with a half-life.

Anchors: Slurm's multifactor fair-share factor and KAI-Scheduler's time-based fair share (both
weigh what a group used recently more than what it used long ago), and Kueue's admission fair
sharing (`usageHalfLifeTime`). In our words:

- Usage is GPU-seconds, and every GPU-second loses half its weight each half-life `h`. A queue
  that held `n` GPUs from `t0` to `t1` and had decayed usage `U0` at `t0` has, at `t1`,

      U1 = U0 * 2^(-dt/h) + n * (h / ln 2) * (1 - 2^(-dt/h)),    dt = t1 - t0

  the second term being the exact integral of `n * 2^(-(t1 - s)/h)` over the interval, so the
  result does not depend on how often it is brought up to date (two half steps give the same
  number as one whole step, up to rounding). A queue holding `n` GPUs for ever tends to
  `n * h / ln 2`.
- Contended GPUs go to queues in order of `U / weight`, least first (higher `priority` before
  any of that). Slurm's factor `F = 2^(-(U / sum U) / (w / sum w))` falls as `U / w` grows, so
  the order is the order of Slurm's factor, highest first; `factors` computes it for reports.

Time is an input: `advance` takes `now` and what each queue held since the last call; nothing
here reads a clock, so a replay reproduces every number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class Usage:
    """Decayed GPU-seconds per queue, as of `at` (None: nothing recorded yet)."""

    at: float | None = None
    gpu_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, queue: str) -> float:
        return self.gpu_s.get(queue, 0.0)

    def advance(self, now: float, held: Mapping[str, float],
                half_life_s: Mapping[str, float]) -> Usage:
        """Usage at `now`, the queues having held `held` GPUs since `at` (each queue decays
        with its own half-life; a queue absent from `half_life_s` does not decay)."""
        if self.at is None:
            return Usage(now, MappingProxyType({q: 0.0 for q in sorted(held) if held[q]}))
        dt = max(0.0, now - self.at)
        out: dict[str, float] = {}
        for q in sorted(set(self.gpu_s) | set(held)):
            out[q] = accrue(self.of(q), held.get(q, 0.0), dt, half_life_s.get(q, math.inf))
        return Usage(now, MappingProxyType(out))


def accrue(usage: float, gpus: float, dt: float, half_life_s: float) -> float:
    """Decayed usage after `dt` seconds holding `gpus` GPUs (see the module docstring)."""
    if dt <= 0:
        return usage
    if math.isinf(half_life_s):
        return usage + gpus * dt
    keep = math.pow(2.0, -dt / half_life_s)
    return usage * keep + gpus * (half_life_s / _LN2) * (1.0 - keep)


def from_runs(runs: Iterable[tuple[str, float, float, float]], now: float,
              half_life_s: Mapping[str, float]) -> Usage:
    """Usage at `now` from what each queue held: (queue, GPUs, from, to) runs, each decayed
    from its end to `now` (a scheduler rebuilt from its recorded transitions)."""
    out: dict[str, float] = {}
    for queue, gpus, start, end in runs:
        h = half_life_s.get(queue, math.inf)
        held = accrue(0.0, gpus, end - start, h)
        out[queue] = out.get(queue, 0.0) + accrue(held, 0.0, now - end, h)
    return Usage(now, MappingProxyType({q: out[q] for q in sorted(out)}))


def order_key(queue: str, usage: float, weight: float, priority: int) -> tuple[int, float, str]:
    """Who gets contended GPUs first: higher priority, then less usage per weight, then name
    (so ties resolve the same way in every run)."""
    return (-priority, usage / weight, queue)


def factors(usage: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Slurm's fair-share factor of each queue, in (0, 1]: 1 for a queue that used nothing,
    0.5 for one whose share of the usage equals its share of the weights."""
    total_u = sum(usage.get(q, 0.0) for q in weights)
    total_w = sum(weights.values())
    out = {}
    for q, w in sorted(weights.items()):
        if total_u <= 0 or total_w <= 0:
            out[q] = 1.0
            continue
        out[q] = math.pow(2.0, -(usage.get(q, 0.0) / total_u) / (w / total_w))
    return out
