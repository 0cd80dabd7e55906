"""Tiresias' 2D-Gittins: the discretised MLFQ of `policies.tiresias`, Gittins-ordered within queues.

This is the simulator's `dlas-gpu-gittins` schedule (Tiresias `run_sim.py`, reused by Muri):
queues, limits, demotions, GPU counting and wake-ups are exactly those of `tiresias` (2D-LAS on
attained GPU-time); only the order inside a queue differs. At every scheduling cycle each queue
is sorted by

1. Gittins index of the job's attained GPU-time, highest first;
2. submission time truncated to whole seconds, earliest first;
3. then, on a tie, the queue's previous order, which is the 2D-LAS order of `policies.tiresias`:
   jobs that ran last cycle in last cycle's order, then waiting jobs, a preempted job in front
   of those already waiting, new and demoted jobs at the back.

The simulator re-sorts every queue with a stable sort each event, after moving the waiting jobs
behind the running ones; rule 3 is what that stable sort keeps. A waiting job's attained
service does not change, so neither does its index: waiting keys stay fixed, as
`policies.mechanisms.ordered` requires. A running job's index is recomputed each cycle from its
attained service, so a running job whose index falls below a waiting one's is preempted at the
next cycle. As in the simulator, no cycle is scheduled for index changes: only arrivals,
completions and the 2D-LAS demotion instants trigger one.

The index (`gittins_index`, variant "tiresias") is the simulator's, quirks included. For
attained service `a`, quantum Δ (3250 s) and the sorted sample `s_1 ≤ … ≤ s_N`:

* `above = #{s > a}`; `P = #{a < s ≤ a + Δ} / above`, rounded to 5 decimals;
* `E = (Σ_{a < s ≤ a + Δ} s + Δ · #{s > a + Δ}) / above`, rounded to 5 decimals. The sum is of
  the sizes themselves, not of the service still needed (`s − a`), so E grows with `a`;
* index = `10⁶ · P / E`, rounded to 4 decimals;
* 0 once `a > s_N − 1`; and when `a + Δ > s_N − 1` the largest sample counts as lying beyond
  the quantum (contributing Δ to E and nothing to P), whatever its size.

The textbook index, `P(S ≤ a + Δ | S > a) / E[min(S, a + Δ) − a | S > a]` (× 10⁶, no rounding),
is available as variant "textbook".

Policies use the index through `GittinsTable`, which discretises it as the simulator does: the
index only changes when attained service passes a sample, and between two samples it is the
formula evaluated one second below the next sample (the simulator's `int(v − 1)`; its samples
are whole seconds). The sample is an input: the policy names the one it ranks by
(`size_distribution`, `yarn-gput1000`, the file the simulator hard-codes) and whoever makes
the policy loads it (`traces.distributions`) and hands it to `configure` or the constructor.

Against Muri's copy of the simulator (Python 3) this makes the same decisions, job for job, on
Muri's trace1 and trace3 (tests/policies/test_gittins.py). Tiresias' own copy runs under
Python 2.7, where E's integer division floors and `round` rounds halves away from zero, so its
ranks can differ in the last digits; this module follows Muri's.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from domain.overhead import OverheadModel
from policies.base import Fitter, JobView, Plan, Snapshot
from policies.mechanisms.ordered import Key
from policies.mechanisms.walk import Stream
from policies.tiresias import DiscretisedLas
from schemas.throughputs import ThroughputTable

Variant = Literal["tiresias", "textbook"]

GITTINS_DELTA = 3250.0  # Tiresias jobs.py `gittins_delta`: the service quantum, GPU-seconds
SCALE = 1_000_000  # the simulator scales P/E by 10⁶ before rounding it to 4 decimals
DEFAULT_DISTRIBUTION = "yarn-gput1000"


def _round(values: NDArray[np.float64], digits: int) -> NDArray[np.float64]:
    # Python's round (correctly rounded decimal), not numpy's scale-rint-unscale, which can
    # differ on halves; these values become sort keys, so ties must come out as the simulator's.
    return np.array([round(float(v), digits) for v in values], dtype=np.float64)


def _sorted_sizes(sizes: ArrayLike) -> NDArray[np.float64]:
    s = np.sort(np.asarray(sizes, dtype=np.float64).ravel())
    if s.size == 0:
        raise ValueError("the size distribution is empty")
    if not (np.isfinite(s).all() and s[0] > 0):
        raise ValueError("job sizes must be positive finite numbers")
    return s


def gittins_index(sizes: ArrayLike, attained: ArrayLike, delta: float = GITTINS_DELTA, *,
                  variant: Variant = "tiresias") -> NDArray[np.float64]:
    """Gittins index (× 10⁶) of each `attained` service for the empirical distribution `sizes`.

    `sizes` need not be sorted; `attained` may be a scalar or an array (the result has its
    shape). See the module docstring for the two variants.
    """
    s = _sorted_sizes(sizes)
    if not (delta > 0 and math.isfinite(delta)):
        raise ValueError(f"the quantum must be a positive number, got {delta!r}")
    a = np.asarray(attained, dtype=np.float64)
    flat = a.ravel()
    n = s.size
    prefix = np.concatenate(([0.0], np.cumsum(s)))  # exact for whole seconds below 2**53
    lo = np.searchsorted(s, flat, side="right")  # first sample above a
    hi = np.searchsorted(s, flat + delta, side="right")  # first sample above a + Δ
    if variant == "tiresias":
        done = flat > s[-1] - 1
        hi = np.where(flat + delta > s[-1] - 1, n - 1, hi)
    elif variant == "textbook":
        done = lo >= n
    else:
        raise ValueError(f"unknown variant {variant!r}; use 'tiresias' or 'textbook'")
    lo = np.minimum(lo, n - 1)  # keeps the arithmetic finite where `done` zeroes the result
    hi = np.maximum(hi, lo)
    above = (n - lo).astype(np.float64)
    inside = (hi - lo).astype(np.float64)
    served = prefix[hi] - prefix[lo]
    if variant == "textbook":
        served = served - flat * inside
    p = inside / above
    e = (served + delta * (n - hi)) / above
    if variant == "tiresias":
        p, e = _round(p, 5), _round(e, 5)
    with np.errstate(divide="ignore"):
        g = np.where(e > 0, p * SCALE / np.where(e > 0, e, 1.0), np.inf)
    if variant == "tiresias":
        g = _round(g, 4)
    g = np.where(done, 0.0, g)
    return g.reshape(a.shape)


@dataclass(frozen=True, eq=False)  # eq=False: compared by identity, not array contents
class GittinsTable:
    """A distribution's index as a step function of attained service, precomputed.

    `values[k]` is the index for attained service in `[sizes[k−1], sizes[k])` (k = 0: below the
    smallest sample), i.e. for `bisect_right(sizes, a) == k`; `values[N] = 0` (past every
    sample). Each step is the formula at one second below its upper end, `sizes[k] − 1`.
    """

    sizes: NDArray[np.float64]
    delta: float
    variant: Variant
    values: NDArray[np.float64] = field(init=False, repr=False)
    _sizes: list[float] = field(init=False, repr=False)
    _values: list[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        s = _sorted_sizes(self.sizes)
        s.flags.writeable = False
        values = np.append(gittins_index(s, s - 1, self.delta, variant=self.variant), 0.0)
        values.flags.writeable = False
        object.__setattr__(self, "sizes", s)
        object.__setattr__(self, "values", values)
        # Plain lists: bisect on a list is several times faster than numpy for one scalar.
        object.__setattr__(self, "_sizes", s.tolist())
        object.__setattr__(self, "_values", values.tolist())

    def __call__(self, attained: float) -> float:
        """The index of one attained service (GPU-seconds)."""
        return self._values[bisect.bisect_right(self._sizes, attained)]

    def lookup(self, attained: ArrayLike) -> NDArray[np.float64]:
        """The index of each attained service in an array."""
        idx = np.searchsorted(self.sizes, np.asarray(attained, dtype=np.float64), side="right")
        return self.values[idx]


def gittins_table(sizes: ArrayLike, delta: float = GITTINS_DELTA,
                  variant: Variant = "tiresias") -> GittinsTable:
    """The table of a job-size sample, built once per process for each distinct sample."""
    return _table(_sorted_sizes(sizes).tobytes(), float(delta), variant)


@functools.lru_cache(maxsize=16)
def _table(sizes: bytes, delta: float, variant: Variant) -> GittinsTable:
    return GittinsTable(np.frombuffer(sizes, dtype=np.float64), delta, variant)


class TiresiasGittins(DiscretisedLas):
    name = "tiresias-gittins"
    description = ("Tiresias 2D-Gittins (dlas-gpu-gittins): MLFQ on GPU-time, Gittins index "
                   "order within each queue (yarn-gput1000, quantum 3250 s)")
    gpu_time = True
    size_distribution = DEFAULT_DISTRIBUTION

    def __init__(self, sizes: ArrayLike | None = None, delta: float = GITTINS_DELTA,
                 variant: Variant = "tiresias") -> None:
        """`sizes`: the job-size sample (GPU-seconds); without it, `configure` brings it."""
        super().__init__()
        self.delta, self.variant = float(delta), variant
        self._table = None if sizes is None else gittins_table(sizes, delta, variant)
        self._views: Mapping[str, JobView] = {}

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        if job_sizes is not None:
            self._table = gittins_table(job_sizes, self.delta, self.variant)

    @property
    def table(self) -> GittinsTable:
        if self._table is None:
            raise ValueError(f"{self.name} ranks jobs by a job-size sample that was not given: "
                             f"load {self.size_distribution!r} and pass it as `job_sizes`")
        return self._table

    def index(self, job: JobView) -> float:
        return self.table(self.attained(job))

    def order_key(self, job: JobView, k: Key) -> Key:
        """The sort key of a job whose 2D-LAS key is `k`: (queue, 0, rank) if it ran last
        cycle, (queue, 1, sequence) if it waits (see policies.tiresias)."""
        return (k[0], -self.index(job), math.floor(job.spec.submit_time_s), *k[1:])

    def key(self, job: JobView) -> Key:
        return self.order_key(job, super().key(job))

    # DiscretisedLas keeps the 2D-LAS keys. `_enqueue` and `streams` put the index in front of
    # them where they reach the ordering (the waiting index, the sorted running list); `plan`
    # lends `streams` the snapshot's views, from which running jobs' indices are recomputed.
    def _enqueue(self, job: JobView, k: Key) -> None:
        super()._enqueue(job, self.order_key(job, k))

    def streams(self, running: list[tuple[Key, str]]) -> list[Stream]:
        rekeyed = sorted((self.order_key(self._views[jid], k), jid) for k, jid in running)
        return super().streams(rekeyed)

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        self._views = snap.jobs
        try:
            return super().plan(snap, fit)
        finally:
            self._views = {}
