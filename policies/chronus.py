"""Chronus (SoCC'21), lease-based deadline scheduling, as ElasticFlow's artifact runs it.

Source: the `time-aware-with-lease` scheduler of ChronusArtifact as shipped in ElasticFlow's
artifact (`chronus-scheduler/alg/scheduler/time_aware_with_lease.py`, `solver.py`), run by
`run_fig8a.sh`/`run_fig8b.sh` with `--lease_term_interval=240 --mip_objective=adaptive
--disable_turn_off=True` (algorithms.md §6). Jobs are rigid: each runs at its requested GPU
count (`spec.gpus`), as in the artifact, whose simulator progresses jobs by their trace
duration (the ElasticFlow traces' durations are the throughput tables' at that count).

Time is cut into lease terms of `lease_s` seconds (`--round-s`; the artifact: 240 s; without
it, Loom's default round of 360 s) on a fixed grid from t = 0, so the policy is round-based:
it plans at every term boundary and nowhere else (a GPU freed mid-term stays idle until the
next term, as in the artifact, whose mid-term filling never runs). Each term, in the
artifact's order:

1. Bookkeeping. A job's estimate is `int(work × (1 + (1 + log2 g) × 0.5 s / lease) × 1.1)`
   seconds (its run time padded for checkpoint/resume and by 10 %); an accepted job needs
   `leases_left` more terms, decremented each term it is selected and lowered to
   ⌈(estimate − progress) / lease⌉ when that is smaller. An accepted job that has held GPUs
   for its whole estimate is demoted to unaccepted and goes first on spare GPUs (the
   artifact's `fake_force_guarantee`); so is one whose terms ran out unfinished (the
   artifact leaves that one accepted but outside the plan, waiting until it is hopeless).
2. Lease selection: every running job is released, and a MILP chooses which accepted jobs
   run in this term (the MILP below). Jobs it drops are demoted to unaccepted.
3. Admission of the jobs that arrived since the previous term: a job with a deadline is
   packed greedily (latest terms first) into the GPUs the current plan leaves free from the
   next term on, beside the other jobs accepted in this term; if it fits before its deadline
   (the deadline rounded down to a term boundary) it is accepted. Otherwise a binary search
   finds the earliest number of terms it would fit in; it is accepted with that later
   deadline if that is within `tolerance` × its relative deadline (the artifact's
   TOLERATE_RATIO = 1.0, which never accepts a later deadline), else it stays unaccepted and
   runs as best-effort. An accepted job first runs at the next term, not this one.
4. Spare ("spot") GPUs: every job not accepted (unaccepted, best-effort, or "lowest": a job
   whose deadline can no longer be met even running from now) is considered, forced jobs
   first, then unaccepted and best-effort before lowest, by least remaining GPU-time
   (lowest: by most negative slack × GPUs), then by submission; each takes its GPUs if that
   many are free. Accepted jobs that the lease plan leaves out do not use spare GPUs.

The lease MILP (`LeaseProblem` → `Selection`). For accepted jobs i with binned GPUs g_i
(`bin_gpus`: 3–4 → 4, 5–7 → 8, as the artifact's `convert_to_bin`; counts above 8 as they
are), r_i terms still needed, and m_i terms before the deadline:

    maximise   Σ_i V·S_i ± Σ_i g_i X[i,0] / C          (V = 10 per job, Chronus' value)
    s.t.       Σ_{b<m_i} X[i,b] = r_i S_i               (a chosen job gets all its terms)
               X[i,b] = 0 for b ≥ m_i                    (before its deadline)
               Σ_i g_i X[i,b] ≤ C for every term b       (C: the cluster's GPUs)
               X, S binary

The sign is the artifact's `adaptive` objective: + (use as many GPUs now as possible) while
no unaccepted job waits, − (leave GPUs free now for them) otherwise; the term is at most 1, so
it only breaks ties between sets of the same value. Deviation: the artifact requires Σ S = 1
for every job (exactly one of its deadline alternatives; ElasticFlow's traces have one), so an
infeasible plan raises and falls back to its greedy; here S_i ≤ 1 and the MILP itself drops
the fewest jobs, which gives the same plan when all can be kept.

Size: deadlines reach thousands of terms (up to 4,418 on Fig. 8a's trace), so the terms
after the first `horizon` ones are merged into segments between consecutive deadlines, each
with an integer variable Y[i,k] ≤ length_k (terms job i gets in segment k) and capacity
C × length_k. Terms inside a segment are interchangeable for every deadline; the terms that
are enacted (the first) and the next `horizon − 1` are exact, and the plan is solved again
every term. With `horizon` ≥ every m_i the problem is exactly the artifact's.

Merging packs a segment only in aggregate, a relaxation: a 4-GPU job for one term and a
2-GPU job for both terms of a 2-term segment of a 4-GPU cluster fit in aggregate (8 ≤ 2 × 4)
but not term by term. A selection is a guarantee only with a per-term layout, so every one
is laid out (`layout`: in each segment the largest jobs first, each on the terms with the
most GPUs left; `lay_out_segment` reports a segment it cannot lay out). Where a segment does
not lay out, it is cut at its midpoint (`segments(..., cuts)`) and the MILP solved again
(`stats.refined`, `stats.refinements`). Each refined MILP is still a relaxation of the exact
problem, so an optimum that lays out is an exact optimum; a one-term segment is exact, so
refining ends, but it is capped at `max_refinements` re-solves, beyond which the greedy below
is used (`stats.unlaid`). Every selection `select` returns therefore has a layout within
capacity, and admission packs against it (`unpack`).

Solving: cvxpy with HiGHS, compiled once per padded size (jobs, and segments where refining
cuts more of them than there are jobs, each to a power of two) with every number a Parameter
(DPP), so a term re-solves without recompiling. Determinism: HiGHS is deterministic for a
given input and options, and each solve starts cold (cvxpy would warm-start it from the
previous problem's solution, which made an answer depend on the solve before it, and from
an infeasible start HiGHS has reported a suboptimal plan as optimal); the search is bounded
by a node limit (`node_limit`; an incumbent found by then is used), and the time limit
(`time_limit_s`, generous) is a safety net whose expiry is counted in `stats.timeouts`. If
HiGHS fails, times out or returns an invalid plan, the artifact's greedy (`greedy_selection`:
by value, larger jobs first, least slack first, each on its latest free terms, which lays
out term by term) is used, which is deterministic.

Not reproduced: alternative deadlines with partial values (Loom jobs have one deadline);
placement (`local_search`) and the profiling stage (neither changes a simulated job's
progress in the artifact); the artifact's mid-term checks every 60 s (a job's end time is
exact in both); node power-off (`--disable_turn_off=True` in the runs reproduced); the short-
lease (≤ 30 s) path, in which accepted jobs may also use spare GPUs.
"""

from __future__ import annotations

import enum
import math
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from policies.base import Fitter, JobView, Plan, Policy, Snapshot, place_runnable
from policies.mechanisms.lp import CompiledCache
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable

if TYPE_CHECKING:  # cvxpy costs about a second to import: only on first use
    import cvxpy as cp

IntArray = np.ndarray[Any, np.dtype[np.int64]]

MAX_VALUE = 10.0  # Chronus' MAX_EXPECT_VALUE: the value of meeting a deadline
PADDING = 1.1  # the artifact pads every estimate by 10 %
CHECKPOINT_S, RESUME_S = 0.1, 0.4  # CHECKPOINT_OVER_HEAD, RESUME_OVER_HEAD (per GPU level)
TOLERATE_RATIO = 1.0


class Tier(enum.IntEnum):
    """The artifact's `queue_priority`."""

    LOWEST = -1  # its deadline cannot be met any more
    ACCEPTED = 0  # guaranteed by the lease plan
    UNACCEPTED = 1  # an SLO job the plan could not take: runs on spare GPUs
    BEST_EFFORT = 2


def bin_gpus(gpus: int) -> int:
    """GPUs a job takes in the lease plan (the artifact's `convert_to_bin`)."""
    if gpus > 8:
        return gpus
    if gpus in (5, 6, 7):
        return 8
    if gpus in (3, 4):
        return 4
    return gpus


def estimate_s(work_s: float, gpus: int, lease_s: float) -> int:
    """The artifact's `estimate_duration`: run time padded for checkpoint/resume and by 10 %."""
    coef = 1 + (1 + math.log2(gpus)) * (RESUME_S + CHECKPOINT_S) / lease_s
    return int(work_s * coef * PADDING)


def leases_for(seconds: float, lease_s: float) -> int:
    """Terms needed to run `seconds` more (⌈seconds / lease⌉, at least 0)."""
    return max(0, math.ceil(seconds / lease_s - 1e-9))


def term_index(t: float, lease_s: float) -> int:
    """The term containing time t (terms start at multiples of lease_s)."""
    return math.floor(t / lease_s + 1e-9)


# -- the lease MILP --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LeaseProblem:
    """One term's job selection. Term 0 is the current one; job i may run in terms
    [0, deadline[i]) and needs `required[i]` of them, with `gpus[i]` (binned) GPUs each."""

    gpus: tuple[int, ...]
    required: tuple[int, ...]
    deadline: tuple[int, ...]
    capacity: int
    spare_now: bool = False  # objective: leave GPUs free now (True) or use them (False)
    value: tuple[float, ...] | None = None  # per job; default MAX_VALUE

    @property
    def n(self) -> int:
        return len(self.gpus)

    def values(self) -> tuple[float, ...]:
        return self.value if self.value is not None else (MAX_VALUE,) * self.n


@dataclass(frozen=True, slots=True)
class Selection:
    """Which jobs the plan keeps and when they run.

    `exact[i]` lists job i's terms before the horizon (all its terms for the greedy);
    `tail[i][k]` is how many terms it gets in segment `segments[k]` (a [start, end) range),
    which `layout` places term by term. Every selection `LeaseSolver.select` returns has a
    layout within capacity; one built otherwise need not (`check_selection`).
    """

    chosen: tuple[bool, ...]
    exact: tuple[tuple[int, ...], ...]
    tail: tuple[tuple[int, ...], ...]
    segments: tuple[tuple[int, int], ...]
    method: str  # "milp", "milp-node-limit", "greedy", "empty"

    @property
    def run_now(self) -> tuple[bool, ...]:
        return tuple(bool(e) and e[0] == 0 for e in self.exact)


def segments(deadlines: Sequence[int], horizon: int,
             cuts: Iterable[int] = ()) -> tuple[tuple[int, int], ...]:
    """The terms after the horizon, cut at every deadline beyond it and at the extra `cuts`
    (refinements) that fall between the horizon and the last deadline."""
    last = max(deadlines, default=0)
    points = sorted({d for d in deadlines if d > horizon}
                    | {c for c in cuts if horizon < c < last})
    out = []
    start = horizon
    for end in points:
        out.append((start, end))
        start = end
    return tuple(out)


@dataclass(frozen=True, slots=True)
class MilpData:
    """Parameter values for a compiled problem of shape (jobs, horizon, segments)."""

    mask: np.ndarray[Any, np.dtype[np.float64]]  # (n, h) 1 where job i may run in term b
    seg_cap: np.ndarray[Any, np.dtype[np.float64]]  # (n, k) terms job i may take in segment k
    gpus: np.ndarray[Any, np.dtype[np.float64]]
    required: np.ndarray[Any, np.dtype[np.float64]]
    value: np.ndarray[Any, np.dtype[np.float64]]
    tie: np.ndarray[Any, np.dtype[np.float64]]  # objective weight of X[i, 0]
    cap_exact: np.ndarray[Any, np.dtype[np.float64]]  # (h,)
    cap_seg: np.ndarray[Any, np.dtype[np.float64]]  # (k,)
    segments: tuple[tuple[int, int], ...]


def milp_data(p: LeaseProblem, shape: tuple[int, int, int],
              cuts: Iterable[int] = ()) -> MilpData:
    """The MILP's numbers for `p` with its segments cut also at `cuts`, padded to `shape`
    (padding rows need 0 terms, value 0; padding segments hold 0 terms)."""
    n, h, k = shape
    segs = segments(p.deadline, h, cuts)
    if p.n > n or len(segs) > k:
        raise ValueError(f"problem ({p.n} jobs, {len(segs)} segments) exceeds shape {shape}")
    mask = np.zeros((n, h))
    seg_cap = np.zeros((n, k))
    for i, d in enumerate(p.deadline):
        mask[i, :max(0, min(d, h))] = 1.0
        for j, (a, b) in enumerate(segs):
            if d >= b:
                seg_cap[i, j] = b - a
    gpus = np.zeros(n)
    gpus[:p.n] = p.gpus
    required = np.zeros(n)
    required[:p.n] = p.required
    value = np.zeros(n)
    value[:p.n] = p.values()
    tie = (-1.0 if p.spare_now else 1.0) * gpus / max(p.capacity, 1)
    cap_seg = np.zeros(k)
    for j, (a, b) in enumerate(segs):
        cap_seg[j] = p.capacity * (b - a)
    return MilpData(mask, seg_cap, gpus, required, value, tie,
                    np.full(h, float(p.capacity)), cap_seg, segs)


@dataclass(frozen=True, slots=True)
class _Milp:
    problem: cp.Problem
    x: cp.Variable
    y: cp.Variable
    s: cp.Variable
    params: dict[str, cp.Parameter]


def build_milp(shape: tuple[int, ...]) -> _Milp:
    """The lease MILP for (jobs, horizon, segments), every number a Parameter (DPP)."""
    import cvxpy as cp
    from cvxpy.atoms.affine.binary_operators import multiply
    from cvxpy.atoms.affine.sum import sum as cp_sum

    n, h, k = shape
    x = cp.Variable((n, h), boolean=True)
    y = cp.Variable((n, k), integer=True)
    s = cp.Variable(n, boolean=True)
    par = {
        "mask": cp.Parameter((n, h), nonneg=True),
        "seg_cap": cp.Parameter((n, k), nonneg=True),
        "gpus": cp.Parameter(n, nonneg=True),
        "required": cp.Parameter(n, nonneg=True),
        "value": cp.Parameter(n, nonneg=True),
        "tie": cp.Parameter(n),
        "cap_exact": cp.Parameter(h, nonneg=True),
        "cap_seg": cp.Parameter(k, nonneg=True),
    }
    constraints = [
        x <= par["mask"], y >= 0, y <= par["seg_cap"],
        par["gpus"] @ x <= par["cap_exact"], par["gpus"] @ y <= par["cap_seg"],
        cp_sum(x, axis=1) + cp_sum(y, axis=1) == multiply(par["required"], s),
    ]
    objective = cp.Maximize(par["value"] @ s + par["tie"] @ x[:, 0])
    return _Milp(cp.Problem(objective, constraints), x, y, s, par)


def shape_for(p: LeaseProblem, horizon: int, cuts: Iterable[int] = ()) -> tuple[int, int, int]:
    """Compiled size: jobs rounded up to a power of two (at least 4); segments as many, or,
    where refinements cut more segments than that, their own power of two."""
    n = _pow2(p.n)
    return (n, horizon, max(n, _pow2(len(segments(p.deadline, horizon, cuts)))))


def _pow2(count: int) -> int:
    return max(4, 1 << (max(count, 1) - 1).bit_length())


def consistent(p: LeaseProblem, sel: Selection) -> bool:
    """Whether a selection keeps the MILP's constraints: its exact terms per term, its merged
    terms in aggregate per segment. A relaxation: see `layout` for the per-term check."""
    used: dict[int, int] = {}
    seg_used = [0] * len(sel.segments)
    for i in range(p.n):
        terms = sel.exact[i]
        counts = sel.tail[i] if sel.tail else ()
        got = len(terms) + sum(counts)
        if got != (p.required[i] if sel.chosen[i] else 0) or len(set(terms)) != len(terms):
            return False
        if any(b < 0 or b >= p.deadline[i] for b in terms):
            return False
        for b in terms:
            used[b] = used.get(b, 0) + p.gpus[i]
        for j, c in enumerate(counts):
            a, e = sel.segments[j]
            if c < 0 or c > e - a or (c and p.deadline[i] < e):
                return False
            seg_used[j] += c * p.gpus[i]
    if any(u > p.capacity for u in used.values()):
        return False
    return all(u <= p.capacity * (e - a) for u, (a, e) in zip(seg_used, sel.segments,
                                                              strict=True))


def fits(p: LeaseProblem, chosen: Sequence[bool], terms: Sequence[IntArray]) -> bool:
    """The exact problem's constraints on a per-term layout: a chosen job holds exactly its
    required number of distinct terms, all before its deadline, another none; no term holds
    more GPUs than the cluster has."""
    used: dict[int, int] = {}
    for i, t in enumerate(terms):
        picked = {int(b) for b in t}
        if len(picked) != len(t) or len(t) != (p.required[i] if chosen[i] else 0):
            return False
        if any(b < 0 or b >= p.deadline[i] for b in picked):
            return False
        for b in picked:
            used[b] = used.get(b, 0) + p.gpus[i]
    return all(u <= p.capacity for u in used.values())


def check_selection(p: LeaseProblem, sel: Selection) -> bool:
    """Whether a selection keeps every constraint of the exact problem: it has a per-term
    layout (`layout`) that `fits`."""
    terms = layout(p, sel)
    return terms is not None and fits(p, sel.chosen, terms)


def greedy_selection(p: LeaseProblem) -> Selection:
    """The artifact's fallback (`batch_fast_job_selection`): jobs by value, larger first, least
    slack first, latest deadline first; each takes its latest terms with room, or none."""
    order = sorted(range(p.n), key=lambda i: (-p.values()[i], -p.gpus[i],
                                             p.deadline[i] - p.required[i], -p.deadline[i], i))
    free = np.full(max(p.deadline, default=0), p.capacity, dtype=np.int64)
    chosen = [False] * p.n
    exact: list[tuple[int, ...]] = [()] * p.n
    for i in order:
        if p.required[i] == 0:
            chosen[i] = True
            continue
        g = p.gpus[i]
        room = np.flatnonzero(free[:max(p.deadline[i], 0)] >= g)[::-1][:p.required[i]]
        if len(room) < p.required[i]:
            continue
        free[room] -= g
        chosen[i] = True
        exact[i] = tuple(sorted(int(b) for b in room))
    return Selection(tuple(chosen), tuple(exact), ((),) * p.n, (), "greedy")


@dataclass(slots=True)
class MilpStats:
    terms: int = 0  # selections made
    solves: int = 0  # selections solved by MILP (terms with at least one accepted job)
    node_limit: int = 0  # MILPs that stopped at the node limit with an incumbent (used)
    timeouts: int = 0  # MILPs stopped by the time limit (greedy used)
    failures: int = 0  # solver errors, no incumbent, or an invalid plan (greedy used)
    refined: int = 0  # selections whose first MILP answer did not lay out per term
    refinements: int = 0  # MILPs re-solved with the unlaid segments split
    unlaid: int = 0  # selections still not laid out after `max_refinements` (greedy used)
    dropped: int = 0  # accepted jobs the plan could not keep (demoted)
    total_s: float = 0.0
    max_s: float = 0.0
    max_jobs: int = 0


@dataclass
class LeaseSolver:
    """Solves `LeaseProblem`s with HiGHS, compiled once per shape; splits merged segments that
    do not lay out per term and solves again, up to `max_refinements` times; greedy on failure.
    Every selection it returns has a per-term layout within capacity."""

    horizon: int = 16
    time_limit_s: float = 60.0
    node_limit: int = 2000
    max_refinements: int = 16  # halves a 4,418-term segment (Fig. 8a's longest) to single terms
    cache: CompiledCache[_Milp] = field(default_factory=lambda: CompiledCache(build_milp))
    stats: MilpStats = field(default_factory=MilpStats)

    def select(self, p: LeaseProblem) -> Selection:
        self.stats.terms += 1
        if p.n == 0:
            return Selection((), (), (), (), "empty")
        t0 = time.perf_counter()
        try:
            sel = self._refined(p)
        finally:
            dt = time.perf_counter() - t0
            self.stats.solves += 1
            self.stats.total_s += dt
            self.stats.max_s = max(self.stats.max_s, dt)
            self.stats.max_jobs = max(self.stats.max_jobs, p.n)
        if sel is None:
            sel = greedy_selection(p)  # lays out by construction: every term is exact
        self.stats.dropped += sum(1 for c in sel.chosen if not c)
        return sel

    def _refined(self, p: LeaseProblem) -> Selection | None:
        """The MILP's selection once it lays out per term. Each MILP is a relaxation of the
        exact problem (merged terms are packed in aggregate), so an optimum that lays out is
        an optimum of the exact problem; where a segment does not lay out, it is cut at its
        midpoint and the MILP solved again. A one-term segment is exact, so this ends; the cap
        bounds the work (deterministically: a count, not a clock)."""
        cuts: set[int] = set()
        for attempt in range(self.max_refinements + 1):
            sel = self._milp(p, cuts)
            if sel is None:
                return None
            unlaid = [sel.segments[j] for j in unlaid_segments(p, sel)]
            if not unlaid:
                return sel
            if attempt == 0:
                self.stats.refined += 1
            if attempt < self.max_refinements:
                self.stats.refinements += 1
                cuts.update((a + b) // 2 for a, b in unlaid)
        self.stats.unlaid += 1
        return None

    def _milp(self, p: LeaseProblem, cuts: Iterable[int]) -> Selection | None:
        from cvxpy.error import SolverError

        shape = shape_for(p, self.horizon, cuts)
        m = self.cache.get(shape)
        data = milp_data(p, shape, cuts)
        for name, par in m.params.items():
            par.value = getattr(data, name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m.problem.solve(  # type: ignore[no-untyped-call]
                    solver="HIGHS", warm_start=False, time_limit=float(self.time_limit_s),
                    mip_max_nodes=int(self.node_limit))
        except (SolverError, ValueError):
            self.stats.failures += 1
            return None
        status = str(m.problem.status)
        info = m.problem.solver_stats.extra_stats if m.problem.solver_stats else None
        nodes = int(getattr(info, "mip_node_count", 0) or 0)
        method = "milp"
        if status == "user_limit":
            if nodes < self.node_limit:  # stopped by the clock: machine-dependent, not used
                self.stats.timeouts += 1
                return None
            if getattr(info, "primal_solution_status", 0) != 2:  # no feasible incumbent
                self.stats.failures += 1
                return None
            self.stats.node_limit += 1
            method = "milp-node-limit"
        elif status != "optimal":
            self.stats.failures += 1
            return None
        sel = _read(p, m, data, method)
        if sel is None or not consistent(p, sel):
            self.stats.failures += 1
            return None
        return sel


def _read(p: LeaseProblem, m: _Milp, data: MilpData, method: str) -> Selection | None:
    if m.x.value is None or m.s.value is None or m.y.value is None:
        return None
    x = np.rint(np.asarray(m.x.value)).astype(np.int64)
    y = np.rint(np.asarray(m.y.value)).astype(np.int64)
    s = np.rint(np.asarray(m.s.value)).astype(np.int64)
    k = len(data.segments)
    chosen = tuple(bool(s[i]) for i in range(p.n))
    exact = tuple(tuple(int(b) for b in np.flatnonzero(x[i])) for i in range(p.n))
    tail = tuple(tuple(int(c) for c in y[i, :k]) for i in range(p.n))
    return Selection(chosen, exact, tail, data.segments, method)


# -- the per-term layout ---------------------------------------------------------------------

def lay_out_segment(gpus: Sequence[int], counts: Sequence[int], length: int,
                    capacity: int) -> list[IntArray] | None:
    """Job i's `counts[i]` distinct terms in a segment of `length` terms (numbered from 0),
    no term over `capacity`; None where this finds no layout (a heuristic: one may exist).
    Largest jobs first, each on the terms with the most GPUs left (the latest among equals):
    where those have no room for a job, no other terms have, given the jobs placed before."""
    free = np.full(length, capacity, dtype=np.int64)
    terms = np.arange(length)
    out = [np.empty(0, dtype=np.int64) for _ in gpus]
    for i in sorted((i for i, c in enumerate(counts) if c > 0), key=lambda i: (-gpus[i], i)):
        c = counts[i]
        if c > length:
            return None
        # one distinct key per term, highest for the most GPUs left, then the latest term
        key = free * length + terms
        pick = np.argpartition(-key, c - 1)[:c] if c < length else terms
        if free[pick].min() < gpus[i]:
            return None
        free[pick] -= gpus[i]
        out[i] = np.sort(pick)
    return out


def _tail_counts(sel: Selection, j: int) -> list[int]:
    return [t[j] for t in sel.tail] if sel.tail else [0] * len(sel.chosen)


def unlaid_segments(p: LeaseProblem, sel: Selection) -> list[int]:
    """The segments of a `consistent` selection that `lay_out_segment` cannot lay out."""
    out = []
    for j, (a, b) in enumerate(sel.segments):
        counts = _tail_counts(sel, j)
        if sum(g for g, c in zip(p.gpus, counts, strict=True) if c) <= p.capacity:
            continue  # its jobs all fit in one term: any terms will do
        if lay_out_segment(p.gpus, counts, b - a, p.capacity) is None:
            out.append(j)
    return out


def layout(p: LeaseProblem, sel: Selection) -> list[IntArray] | None:
    """Every job's terms, its exact ones and each segment's laid out per term
    (`lay_out_segment`); None where the selection is not `consistent` or a segment does not
    lay out (the MILP packs merged terms only in aggregate, which can promise too much: in
    a 2-term segment of a 4-GPU cluster, a 4-GPU job for one term and a 2-GPU job for both
    fit in aggregate, 8 ≤ 2 × 4, but not term by term)."""
    if not consistent(p, sel):
        return None
    out = [np.asarray(sel.exact[i], dtype=np.int64) for i in range(p.n)]
    for j, (a, b) in enumerate(sel.segments):
        placed = lay_out_segment(p.gpus, _tail_counts(sel, j), b - a, p.capacity)
        if placed is None:
            return None
        out = [np.concatenate([o, t + a]) for o, t in zip(out, placed, strict=True)]
    return out


def unpack(p: LeaseProblem, sel: Selection) -> list[IntArray]:
    """`layout` of a selection that has one (every selection `LeaseSolver.select` returns)."""
    terms = layout(p, sel)
    if terms is None:
        raise ValueError("the selection has no per-term layout within capacity")
    return terms


# -- admission -------------------------------------------------------------------------------

Item = tuple[int, int, int]  # (binned GPUs, terms needed, terms before the deadline)


def packable(free: IntArray, items: Sequence[Item], capacity: int) -> bool:
    """The artifact's `batch_fast_check_if_packable`: larger jobs first, then least slack,
    then latest deadline; each takes its latest terms with enough GPUs left. `free[b]` is
    what term b has left; terms after the end of `free` are idle (`capacity` free)."""
    room = _extend(free, max((e[2] for e in items), default=0), capacity).copy()
    for g, need, limit in sorted(items, key=lambda e: (-e[0], e[2] - e[1], -e[2])):
        if need <= 0:
            continue
        if need > limit:
            return False
        fits = np.flatnonzero(room[:limit] >= g)
        if len(fits) < need:
            return False
        room[fits[::-1][:need]] -= g
    return True


def earliest_limit(free: IntArray, batch: Sequence[Item], job: Item, capacity: int) -> int:
    """The artifact's binary search: the fewest terms within which `job` packs beside `batch`,
    searched from its own limit up to the furthest planned term + its need + 1 (where it
    always packs, if it fits the cluster at all)."""
    g, need, limit = job
    left = max(limit, need)
    furthest = max([len(free), left, *(b[2] for b in batch)])
    right = furthest + need + 1
    while left < right:
        mid = (left + right) // 2
        if packable(free, [*batch, (g, need, mid)], capacity):
            right = mid
        else:
            left = mid + 1
    return right


# -- the policy ------------------------------------------------------------------------------

@dataclass(slots=True)
class _Job:
    tier: Tier
    estimate_s: int
    leases_left: int = 0
    end_term: int = 0  # an accepted job runs in terms before this one (absolute index)
    deadline_s: float = math.inf  # the deadline it is held to (an accepted job's: term-aligned)
    forced: bool = False  # ran its whole estimate: first on spare GPUs
    new: bool = True  # not yet through admission


class Chronus(Policy):
    name = "chronus"
    description = "Chronus: lease terms, a MILP picks the deadline jobs, spare GPUs best-effort"
    placement = "count"
    replan = "round"

    def __init__(self, *, lease_s: float = 240.0, horizon: int = 16,
                 time_limit_s: float = 60.0, node_limit: int = 2000,
                 tolerance: float = TOLERATE_RATIO) -> None:
        self.lease_s = lease_s
        self.tolerance = tolerance
        self.solver = LeaseSolver(horizon=horizon, time_limit_s=time_limit_s,
                                  node_limit=node_limit)
        self.jobs: dict[str, _Job] = {}
        self.accepted = 0
        self.unaccepted = 0
        self._unaccepted_seen = 0  # the artifact's `number_of_accepted` (sic): objective sign
        self._last: Plan | None = None
        self._position: dict[str, int] = {}

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None) -> None:
        self.lease_s = round_s

    def job_added(self, job: JobView) -> None:
        spec = job.spec
        slo = spec.deadline_s is not None and not spec.best_effort
        work = spec.iterations * spec.iteration_time_at(spec.gpus)
        self.jobs[job.job_id] = _Job(Tier.ACCEPTED if slo else Tier.BEST_EFFORT,
                                     estimate_s(work, spec.gpus, self.lease_s))

    def job_removed(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self._position.pop(job_id, None)

    # -- a term ----------------------------------------------------------------------------
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        lease = self.lease_s
        term = term_index(snap.now, lease)
        views = [v for v in snap.jobs.values() if v.job_id in self.jobs]

        # 1. bookkeeping of accepted jobs (the artifact's flush_running_jobs / lease update)
        for v in views:
            rec = self.jobs[v.job_id]
            if rec.new or rec.tier is not Tier.ACCEPTED:
                continue
            done_s = v.iterations_done * v.spec.iteration_time_at(v.spec.gpus)
            rec.leases_left = min(rec.leases_left, leases_for(rec.estimate_s - done_s, lease))
            if v.attained_s >= rec.estimate_s or rec.leases_left <= 0:
                rec.tier, rec.forced = Tier.UNACCEPTED, True

        # 2. lease selection among accepted jobs
        planned = [v for v in views
                   if not self.jobs[v.job_id].new and self.jobs[v.job_id].tier is Tier.ACCEPTED]
        problem = LeaseProblem(
            gpus=tuple(bin_gpus(v.spec.gpus) for v in planned),
            required=tuple(self.jobs[v.job_id].leases_left for v in planned),
            deadline=tuple(self.jobs[v.job_id].end_term - term for v in planned),
            capacity=snap.cluster.total_gpus,
            spare_now=self._unaccepted_seen > 0,
        )
        sel = self.solver.select(problem)
        selected: list[JobView] = []
        for i, v in enumerate(planned):
            rec = self.jobs[v.job_id]
            if not sel.chosen[i]:
                rec.tier = Tier.UNACCEPTED
            elif sel.run_now[i]:
                selected.append(v)
                rec.leases_left -= 1
        self._unaccepted_seen = sum(1 for v in views
                                    if self.jobs[v.job_id].tier is Tier.UNACCEPTED)

        # 3. admission of the jobs that arrived since the last term
        arrivals = [v for v in views if self.jobs[v.job_id].new]
        if arrivals:
            self._admit(arrivals, problem, sel, term, snap.cluster.total_gpus)

        # 4. spare GPUs for everything not accepted
        picked = {v.job_id for v in selected}
        spot: list[JobView] = []
        for v in views:
            rec = self.jobs[v.job_id]
            if v.job_id in picked:
                continue
            remaining_s = v.remaining_iterations * v.spec.iteration_time_at(v.spec.gpus)
            if (rec.tier in (Tier.ACCEPTED, Tier.UNACCEPTED)
                    and rec.deadline_s < snap.now + remaining_s):
                rec.tier = Tier.LOWEST
            if rec.tier is not Tier.ACCEPTED:
                spot.append(v)
        spot.sort(key=lambda v: self._spot_key(v, snap.now))
        return self._place(selected, spot, fit)

    def _admit(self, arrivals: list[JobView], problem: LeaseProblem, sel: Selection,
               term: int, capacity: int) -> None:
        lease = self.lease_s
        free = np.full(max([*problem.deadline, 1]), capacity, dtype=np.int64)
        for i, terms in enumerate(unpack(problem, sel)):
            free[terms] -= problem.gpus[i]
        free = np.maximum(free[1:], 0)  # from the next term on (this one is decided)
        batch: list[Item] = []
        for v in arrivals:
            rec = self.jobs[v.job_id]
            rec.new = False
            if rec.tier is Tier.BEST_EFFORT:
                continue
            deadline = v.spec.deadline_s if v.spec.deadline_s is not None else math.inf
            rec.leases_left = leases_for(rec.estimate_s, lease)
            limit = term_index(deadline, lease) - (term + 1)
            item = (bin_gpus(v.spec.gpus), rec.leases_left, limit)
            fits_cluster = item[0] <= capacity
            ok = fits_cluster and packable(free, [*batch, item], capacity)
            if not ok and fits_cluster:
                later = earliest_limit(free, batch, item, capacity)
                relative = deadline - v.spec.submit_time_s
                promised = lease * (later + term + 1) - v.spec.submit_time_s
                if promised <= relative * self.tolerance:
                    ok, limit = True, later
                    item = (item[0], item[1], limit)
            if ok:
                rec.tier = Tier.ACCEPTED
                rec.end_term = term + 1 + limit
                rec.deadline_s = lease * rec.end_term
                batch.append(item)
                self.accepted += 1
            else:
                rec.tier = Tier.UNACCEPTED
                rec.deadline_s = deadline
                self._unaccepted_seen += 1
                self.unaccepted += 1

    def _spot_key(self, v: JobView, now: float) -> tuple[int, int, float, float, str]:
        rec = self.jobs[v.job_id]
        done_s = v.iterations_done * v.spec.iteration_time_at(v.spec.gpus)
        if rec.tier is Tier.LOWEST:
            urgency = -(rec.deadline_s - now - rec.estimate_s + done_s) * v.spec.gpus
        else:
            urgency = -(rec.estimate_s - done_s) * v.spec.gpus
        return (0 if rec.forced else 1, 1 if rec.tier is Tier.LOWEST else 0, -urgency,
                v.spec.submit_time_s, v.job_id)

    def _place(self, selected: list[JobView], spot: list[JobView], fit: Fitter) -> Plan:
        plan = Plan()
        # lease jobs, larger first as the artifact places them
        for v in sorted(selected, key=lambda v: -v.spec.gpus):
            slots = place_runnable(fit, v.spec, v.spec.gpus)
            if slots is None:  # a topology-aware placer may refuse; the term is not used
                self.jobs[v.job_id].leases_left += 1
                plan.blocked[v.job_id] = Status(
                    code=StatusCode.WAITING_FOR_CONSOLIDATED_GPUS, reason=fit.explain(
                        v.spec.gpus), decided_by=self.name)
                continue
            plan.run[v.job_id] = slots
        waiting: list[str] = []
        for v in spot:
            g = v.spec.gpus
            slots = place_runnable(fit, v.spec, g) if g <= fit.free_gpus else None
            if slots is None:
                waiting.append(v.job_id)
                continue
            plan.run[v.job_id] = slots
        self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        plan.free_gpus = fit.free_gpus
        self._last = plan
        return plan

    def waiting_status(self, job_id: str) -> Status:
        rec = self.jobs.get(job_id)
        if self._last is not None and job_id in self._last.blocked:
            return self._last.blocked[job_id]
        if rec is None or rec.new:
            return Status(code=StatusCode.WAITING_BY_POLICY, decided_by=self.name,
                          reason="admission at the next lease term")
        if rec.tier is Tier.ACCEPTED:
            return Status(code=StatusCode.WAITING_BY_POLICY, decided_by=self.name,
                          reason="deadline guaranteed; the lease plan runs it in a later term")
        reason = {
            Tier.UNACCEPTED: "deadline not guaranteed; waits for spare GPUs",
            Tier.BEST_EFFORT: "best-effort; waits for spare GPUs",
            Tier.LOWEST: "its deadline can no longer be met; lowest priority on spare GPUs",
        }[rec.tier]
        return Status(code=StatusCode.WAITING_FOR_PRIORITY, reason=reason, decided_by=self.name,
                      queue_position=self._position.get(job_id))


def _extend(free: IntArray, length: int, capacity: int) -> IntArray:
    """`free` with idle terms (the whole cluster) appended up to `length`."""
    if len(free) >= length:
        return free
    return np.concatenate([free, np.full(length - len(free), capacity, dtype=np.int64)])
