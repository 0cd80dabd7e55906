"""Themis' finish-time fairness, as the Muri simulator's baseline runs it (algorithms.md §9).

Every cycle, for the runnable jobs m (running and waiting):

1. Solve the finish-time-fairness problem of Gavel's port (§3a, §9)::

       minimise   max_m rho_m(x_m)
       subject to 0 <= x_m <= 1,  sum_m gpus_m * x_m <= G   (G: GPUs in the cluster)
       rho_m(x) = (now - submit_m + remaining_m / (tput_m * x)) / iso_m
       iso_m    = t_iso_m + remaining_m / share_m
       share_m  = min(1, ceil(G / M) / gpus_m)                (M: runnable jobs)

   `tput_m = 1 / iteration_time_m` (iterations per second, one GPU type) and `t_iso_m`
   accumulates, cycle after cycle, the iterations the job made since the previous cycle
   divided by the share it had then.

   Muri's units slip, reproduced on purpose: its "isolated throughput" helper returns the
   share itself, not share × throughput, so `iso_m` (and `t_iso_m`) count iterations per
   unit of share, not seconds. The numerator is in seconds, so each rho_m is the intended
   ratio times the job's iteration time: jobs with slow iterations look less fairly treated
   and get more share. `Themis(muri_units=False)` divides by share × throughput instead.

2. Rank jobs, highest first, by `x_m / attained_m` (`x_m × 1e9` for a job that never ran),
   then by deficit (time it should have received so far minus attained time), then by x_m;
   Muri breaks the remaining ties by its list order, Loom by submit time and job id.
3. Fill the cluster greedily in that order, skipping jobs that do not fit (`greedy_fill`).

Bookkeeping Muri keeps and Loom reproduces, slips included: the deficit is taken before this
cycle's update; the update `should_m += x_m × (now − previous cycle)` uses the share just
solved for an interval that is already over, and a job that arrived at `now` is credited for
the whole interval since the previous cycle (which started before it existed).

Solving. rho_m = a_m + b_m / x_m with a_m = (now − submit_m) / iso_m ≥ 0 and
b_m = remaining_m × iteration_time_m / iso_m > 0, convex for x_m > 0; in cvxpy
`a + multiply(b, inv_pos(x))`, with a, b, the GPU counts and G as Parameters, so the problem is
DPP: it is compiled once per size and each cycle only re-solves. Sizes are bucketed (exact up
to 16, then 4 significant bits, ≤ 12.5 % padding). A padding slot has a = 0, b = max_m(a_m + b_m)
(a lower bound of the optimum, so the slot is satisfied at some x ≤ 1 and never binds) and 0
GPUs (it takes no capacity).

When the capacity does not bind at the optimum (light load), the optimum is not unique: any x_m
keeping rho_m below the bottleneck's value is optimal, and the point returned depends on the
solver and on how the data are scaled. Muri (ECOS) passes raw values; so does Loom, which keeps
Clarabel's choice closer to ECOS' than normalised data would (docs/validation.md).
Solvers: Clarabel on the raw data. If that fails or is inaccurate and the capacity binds, the
optimum is unique and has a closed form up to a 1-D root (`binding_shares`), used instead;
otherwise Clarabel then SCS on data scaled to max(a + b) = 1; then Muri's "equal weight"
fallback: x_m = 1 for every job, so the order degenerates to least attained time first. Muri
calls ECOS, then SCS (ECOS is not a dependency here).

Not reproduced: Muri's throughput includes its 1.015 iteration-time calibration, which Loom
applies in the `muri` overhead model that policies do not see, so b_m is 1.5 % below Muri's.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from policies.base import Fitter, JobView, Plan, Policy, Snapshot, status_for_waiting
from policies.mechanisms.lp import USABLE, FloatArray, LpStats, as_summary, bucket
from policies.mechanisms.walk import Ranked, greedy_fill
from schemas.status import Status

if TYPE_CHECKING:  # cvxpy is imported on first use: it costs about a second at start-up
    import cvxpy as cp

SOLVERS: tuple[str, ...] = ("CLARABEL", "SCS")
NEVER_RAN = 1e9  # Muri's priority multiplier for a job with no executed time
X_DIGITS = 9  # shares are rounded here (below solver tolerance) so equal jobs tie exactly


def rank_key(x: float, attained_s: float, deficit: float, submit_s: float) -> tuple[float, ...]:
    """Sort key, lower first: Muri's (priority, deficit, x) descending, then submit time.

    priority = x / attained time, or x × 1e9 for a job that never ran.
    """
    prio = x * NEVER_RAN if attained_s == 0 else x / attained_s
    return (-prio, -deficit, -x, submit_s)


def binding_shares(a: FloatArray, b: FloatArray, gpus: FloatArray,
                   capacity: float) -> FloatArray | None:
    """The optimum when the capacity binds, without a solver; None when it does not bind.

    rho_m ≤ t needs x_m ≥ b_m / (t − a_m). If the smallest such shares at t0 = max(a + b)
    (where the bottleneck has x = 1) overflow the capacity, the optimum t* > t0 is the t with
    sum_m gpus_m · b_m / (t − a_m) = capacity, every rho_m equals t*, and the shares
    x_m = b_m / (t* − a_m) are unique. Found by bisection on t (the sum decreases in t).
    """
    def need(t: float) -> float:
        return float(gpus @ np.minimum(1.0, b / (t - a)))

    lo = float((a + b).max())
    if need(lo) <= capacity:
        return None  # not binding: a face of optima, left to the solver
    hi = float(a.max()) + float(gpus @ b) / capacity  # need(hi) ≤ capacity
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if need(mid) > capacity else (lo, mid)
    return np.minimum(1.0, b / (hi - a))


@dataclass(frozen=True, slots=True)
class _Compiled:
    problem: cp.Problem
    x: cp.Variable
    a: cp.Parameter
    b: cp.Parameter
    gpus: cp.Parameter
    capacity: cp.Parameter


@dataclass
class FairnessLp:
    """min over x of max_m (a_m + b_m / x_m), 0 ≤ x ≤ 1, gpus · x ≤ capacity; cached by size."""

    solvers: Sequence[str] = SOLVERS
    stats: LpStats = field(default_factory=LpStats)
    _cache: dict[int, _Compiled] = field(default_factory=dict)

    def __deepcopy__(self, memo: dict[int, Any]) -> FairnessLp:
        return FairnessLp(self.solvers)  # as `lp.CompiledCache.__deepcopy__`, and why

    def compiled(self, size: int) -> _Compiled:
        hit = self._cache.get(size)
        if hit is not None:
            self.stats.cache_hits += 1
            return hit
        import cvxpy as cp
        from cvxpy.atoms.affine.binary_operators import multiply
        from cvxpy.atoms.elementwise.inv_pos import inv_pos
        from cvxpy.atoms.max import max as cp_max

        self.stats.compiles += 1
        x = cp.Variable(size)
        a = cp.Parameter(size, nonneg=True)
        b = cp.Parameter(size, nonneg=True)
        gpus = cp.Parameter(size, nonneg=True)
        capacity = cp.Parameter(nonneg=True)
        rho = a + multiply(b, inv_pos(x))  # type: ignore[no-untyped-call]
        problem = cp.Problem(cp.Minimize(cp_max(rho)), [x >= 0, x <= 1, gpus @ x <= capacity])
        made = self._cache[size] = _Compiled(problem, x, a, b, gpus, capacity)
        return made

    def solve(self, a: FloatArray, b: FloatArray, gpus: FloatArray,
              capacity: float) -> FloatArray | None:
        """Shares x (clipped to [0, 1]) or None if every solver failed or inputs are unusable."""
        t0 = time.perf_counter()
        try:
            return self._solve(a, b, gpus, capacity)
        finally:
            dt = time.perf_counter() - t0
            self.stats.solves += 1
            self.stats.total_s += dt
            self.stats.max_s = max(self.stats.max_s, dt)

    def _solve(self, a: FloatArray, b: FloatArray, gpus: FloatArray,
               capacity: float) -> FloatArray | None:
        n = len(a)
        lower = a + b  # rho_m at x_m = 1: no allocation does better
        if (n == 0 or not (np.all(np.isfinite(lower)) and np.all(a >= 0) and np.all(b > 0))
                or not np.all(np.isfinite(gpus)) or capacity <= 0 or not math.isfinite(capacity)):
            self.stats.fallbacks += 1
            return None
        from cvxpy.error import SolverError

        size = bucket(n)
        lp = self.compiled(size)
        pad = size - n
        lp.gpus.value = np.concatenate([gpus, np.zeros(pad)])
        lp.capacity.value = float(capacity)
        # Raw data first (as Muri), then scaled so that max(a + b) = 1 for any retry: raw
        # values can span 1e7 and trouble the solver; scaling does not move the optimum.
        top = float(lower.max())
        attempts = [(self.solvers[0], 1.0)] if self.solvers else []
        attempts += [(solver, top) for solver in self.solvers]
        backup: FloatArray | None = None
        for i, (solver, scale) in enumerate(attempts):
            if i == 1:  # the first solve failed: if the capacity binds, the optimum is known
                exact = binding_shares(a, b, gpus, capacity)
                if exact is not None:
                    self.stats.exact += 1
                    return exact
            lp.a.value = np.concatenate([a / scale, np.zeros(pad)])
            lp.b.value = np.concatenate([b / scale, np.full(pad, top / scale)])
            try:
                with warnings.catch_warnings():  # "may be inaccurate": handled below
                    warnings.simplefilter("ignore", UserWarning)
                    # A fresh solver each time: by default cvxpy updates the previous Clarabel
                    # instance in place, and then the same data can give another answer
                    # depending on what was solved before (seen: other iterations, other x).
                    lp.problem.solve(  # type: ignore[no-untyped-call]
                        solver=solver, warm_start=False)
            except SolverError:
                continue
            value, status = lp.x.value, lp.problem.status
            if status not in USABLE or value is None:
                continue
            x = np.clip(np.asarray(value[:n], dtype=np.float64), 0.0, 1.0)
            if not np.all(np.isfinite(x)):
                continue
            if status == "optimal":
                self.stats.rescaled += i == 1
                self.stats.secondary += i > 1
                return x
            if backup is None:
                backup = x
        if backup is not None:
            self.stats.inaccurate += 1
            return backup
        self.stats.fallbacks += 1
        return None


@dataclass(slots=True)
class _Book:
    """What Themis remembers about one job between cycles."""

    gpus: int
    iso: float = 0.0  # cumulative isolated time t_iso (Muri's units unless muri_units=False)
    prev_remaining: float | None = None  # remaining iterations at the previous cycle
    prev_share: float = 1.0  # isolated share at the previous cycle
    should: float = 0.0  # time it should have received (Muri's time_should_received)
    deficit: float = 0.0
    x: float | None = None  # last share
    rho: float | None = None  # last finish-time fairness, at x


class Ledger(NamedTuple):
    """A read-only copy of one job's bookkeeping (for metrics and tests)."""

    iso: float
    should: float
    deficit: float
    x: float | None
    rho: float | None


class Themis(Policy):
    name = "themis"
    description = "Themis finish-time fairness LP (Muri/Gavel port), then x/attained priority"
    placement = "consolidated"
    replan = "event"

    def __init__(self, *, muri_units: bool = True, solvers: Sequence[str] = SOLVERS) -> None:
        self.muri_units = muri_units
        self.lp = FairnessLp(solvers=tuple(solvers))
        self._books: dict[str, _Book] = {}
        self._last_now = 0.0  # Muri starts its "previous event" clock at 0
        self._position: dict[str, int] = {}  # waiting job → 1-based rank in the last ordering
        self._last: Plan | None = None
        self.order: list[str] = []  # the last cycle's ranking, best first
        self.solved = False  # whether the last cycle's shares came from a solver

    # -- hooks -------------------------------------------------------------------------------
    def job_added(self, job: JobView) -> None:
        self._books.setdefault(job.job_id, _Book(job.gpus))

    def job_removed(self, job_id: str) -> None:
        self._books.pop(job_id, None)
        pos = self._position.pop(job_id, None)
        if pos is not None:  # close the gap behind it
            for jid, p in self._position.items():
                if p > pos:
                    self._position[jid] = p - 1

    # -- queries -----------------------------------------------------------------------------
    def fairness(self, job_id: str) -> float | None:
        """The job's finish-time fairness rho at the last cycle's shares (the LP's units).

        None before its first cycle, and after a cycle where no solver produced shares.
        """
        book = self._books.get(job_id)
        return None if book is None else book.rho

    def ledger(self, job_id: str) -> Ledger | None:
        """The job's isolated time, time it should have received, deficit, x and rho."""
        book = self._books.get(job_id)
        if book is None:
            return None
        return Ledger(book.iso, book.should, book.deficit, book.x, book.rho)

    def solver_stats(self) -> dict[str, float | int]:
        return as_summary(self.lp.stats)

    def waiting_status(self, job_id: str) -> Status:
        book = self._books.get(job_id)
        gpus = book.gpus if book is not None else 0
        return status_for_waiting(job_id, gpus, self._last, self._position.get(job_id),
                                  self.name)

    # -- the cycle ---------------------------------------------------------------------------
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        now = snap.now
        jobs = sorted(snap.jobs.values(), key=lambda v: (v.spec.submit_time_s, v.job_id))
        ranked: list[Ranked] = []
        if jobs:
            x = self._shares(jobs, snap.cluster.total_gpus, now)
            dt = now - self._last_now
            for job, xm in zip(jobs, x, strict=True):
                book = self._books[job.job_id]
                xm = round(float(xm), X_DIGITS)
                book.deficit = book.should - job.attained_s  # before this cycle's credit
                book.should += xm * dt
                book.x = xm
                key = rank_key(xm, job.attained_s, book.deficit, job.spec.submit_time_s)
                ranked.append((key, job.job_id))
            ranked.sort()
        self.order = [jid for _, jid in ranked]
        plan = greedy_fill([(None, iter(ranked))], snap.jobs, fit, self.name)
        waiting = [jid for jid in self.order if jid not in plan.run]
        self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        self._last = plan
        self._last_now = now
        return plan

    def _shares(self, jobs: list[JobView], cluster_gpus: int, now: float) -> FloatArray:
        """Update each job's isolated time and solve for this cycle's shares x."""
        n = len(jobs)
        even = math.ceil(cluster_gpus / n) if cluster_gpus > 0 else 0
        a = np.empty(n)
        b = np.empty(n)
        gpus = np.empty(n)
        for i, job in enumerate(jobs):
            book = self._books.get(job.job_id)
            if book is None:  # not announced through job_added: adopt it now
                book = self._books[job.job_id] = _Book(job.gpus)
            share = min(1.0, even / job.gpus)
            per = 1.0 if self.muri_units else job.spec.iteration_time_s  # see module docstring
            remaining = job.remaining_iterations
            if book.prev_remaining is not None and book.prev_share > 0:
                book.iso += (book.prev_remaining - remaining) * per / book.prev_share
            book.prev_remaining, book.prev_share = remaining, share
            iso = book.iso + remaining * per / share if share > 0 else math.inf
            a[i] = (now - job.spec.submit_time_s) / iso if iso > 0 else math.inf
            b[i] = remaining * job.spec.iteration_time_s / iso if iso > 0 else math.inf
            gpus[i] = job.gpus
        x = self.lp.solve(a, b, gpus, float(cluster_gpus))
        self.solved = x is not None
        if x is None:
            x = np.ones(n)  # Muri's equal weight
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = a + b / x
        for job, r in zip(jobs, rho, strict=True):
            self._books[job.job_id].rho = float(r) if self.solved and math.isfinite(r) else None
        return x
