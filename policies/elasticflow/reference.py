"""ElasticFlow (ASPLOS'23) with admission control, as its artifact runs it (`ef-accessctrl`).

Every cycle (slotted, 60 s by default) the admitted jobs are planned into a profile of free
GPUs over time, in deadline order, each at its *minimum satisfactory share* (MSS): for the GPU
counts q = 1, 2, 4, … of its throughput table, the planner walks the free-GPU profile
backwards from the deadline, giving the job min(q, the largest level that fits) GPUs in each
period, until the work done reaches the job's remaining iterations; the first q that gets
there is the job's share, and its plan is then laid forward from now (earlier periods at the
previous level, later ones at q). A job that cannot finish by its deadline at any level runs
after the deadline with what is left, then with all the GPUs it can use.

Admission: when jobs arrive, the admitted jobs and the newcomers are planned together; if any
of them would then miss its deadline, *every* newcomer of that cycle is declined (the
artifact's quirk: one merged event admits all of its new jobs or none, and an admitted job
already running late blocks every arrival). Best-effort jobs (and jobs without a deadline)
have an infinite deadline: they are always admitted and planned after the deadline jobs.

The GPUs the plans leave free now are handed out one level at a time by marginal return
(`allocate_free_gpus`): for every job that can grow by one level within the free GPUs, the
job is re-planned with that many GPUs from now, and its marginal is the change in the GPU time
of its plan per added GPU (jobs holding no GPU first). The job with the *largest* marginal
gets its next level; marginals are recomputed, until no GPU is left or no job can grow.

Paper against artifact, and what this module does: the paper hands leftover GPUs out "based
on diminishing returns", i.e. to the job that gains most from one more GPU, which in GPU-time
terms is the *smallest* increase per added GPU. The artifact sorts the increase in
*descending* order, so among jobs that already run the worst scaler grows first. We keep the
artifact's order, because the published figures come from that code and this policy exists to
reproduce them; `ElasticFlow.leftover_order` names the choice, and an unregistered subclass
with "ascending" gives the paper's reading (jobs holding no GPU still first). On Fig. 8a (195
jobs, 16 x 4 T4) the two orders give deadline ratios of 0.703 (artifact's) and 0.697
(paper's) with the elasticflow overhead model, 0.774 and 0.774 without overheads.

Only the allocation now is enacted; the planned future decides when to look again: the policy
asks for a cycle at the first time any job's plan changes its GPU count (the artifact's
scaling events). Jobs may use the GPU counts of their throughput table up to the artifact's
per-model cap (`models.get_max_gpu`: e.g. T4 yolov3 at most 4, ncf 1, A100 bert batch 64 at
most 8); a job without a scaling table runs at its requested size or not at all.

Placement is by count (ElasticFlow's buddy allocation never fails to place what its planner
gives: power-of-two gangs on power-of-two nodes, so only the count matters here).

The planner is the artifact's `ef_sim_allocation`, `estimate_all_jobs` and
`allocate_free_gpus` step for step (including its float summation order, its ends rounded up
to whole seconds and slots, and its stable sorts); on 6,600 random cases (T4 and A100 tables,
4 to 256 GPUs, up to 30 jobs, feasible, infeasible and best-effort) it returns the artifact's
plans, profiles, GPU counts and job order exactly. Where the artifact would fail (a late job
alone in the plan, whose trial needs a breakpoint the profile lacks) the job keeps the
assigned GPUs until done. What differs is the simulator around it: Loom ends a job when its
work is done, not at its slot-aligned planned end, charges overheads by its own model, and
judges a deadline by the simulated end where the artifact takes the planned one.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import compress
from typing import ClassVar, Literal, cast

import numpy as np

from policies import elasticflow_aot
from policies.base import Fitter, JobView, Plan, Policy, Snapshot
from policies.edf import align_to_slot
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable

# The artifact's "no deadline" (best-effort jobs) and its ±infinite marginals (sys.maxsize).
NO_DEADLINE = float(sys.maxsize)
_TOP = float(sys.maxsize)
_TABLE_MAX = 64  # the throughput tables' largest GPU count

# models.get_max_gpu, T4 and A100 folded into one rule: the two tables share only bert
# (T4 batch 384 → 16; A100 batch 64 → 8, 128 → 16) and deepspeech2 (T4 batch 320 → 32,
# 640 → 64; A100: the batch size, 32 or 64), so the GPU type need not be known.
_CAP_BY_MODEL = {"cifar10": 16, "yolov3": 4, "ncf": 1, "bert": 16}
_CAP_BY_BATCH = {
    ("bert", 64): 8, ("deepspeech2", 320): 32, ("gpt2", 128): 16, ("gpt2", 256): 32,
    ("inception3", 64): 16, ("inception3", 128): 32, ("resnet50", 64): 32, ("vgg16", 64): 32,
}  # fmt: skip


def artifact_max_gpus(model: str, batch_size: int | None) -> int:
    """The largest GPU count ElasticFlow lets a job of this model and batch size use."""
    batch = batch_size or _TABLE_MAX
    if (model, batch) in _CAP_BY_BATCH:
        return _CAP_BY_BATCH[(model, batch)]
    if model in _CAP_BY_MODEL:
        return _CAP_BY_MODEL[model]
    return min(batch, _TABLE_MAX)


@cache
def _fit_table(levels: tuple[int, ...]) -> tuple[int, ...]:
    """For f = 0 … the top level: the largest level within f GPUs (0: none)."""
    fit = [0] * (levels[-1] + 1)
    for g in levels:
        fit[g:] = [g] * (len(fit) - g)
    return tuple(fit)


@dataclass(frozen=True)
class Need:
    """What the planner needs of one job: its work, deadline and speed at each GPU count."""

    job_id: str
    left: float  # iterations still to do
    deadline: float  # NO_DEADLINE for best-effort jobs
    rate: Mapping[int, float]  # iterations/s of the whole job at each usable GPU count
    levels: tuple[int, ...] = field(init=False)  # ascending
    # fit[f]: the largest level within f free GPUs (0: none), for f up to the top level
    fit: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        levels = tuple(sorted(self.rate))
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "fit", _fit_table(levels))

    @classmethod
    def of(cls, job: JobView, known: dict[str, Mapping[int, float]] | None = None) -> Need:
        """The job's need now; `known` keeps each job's speeds (fixed by its spec) between
        cycles."""
        deadline = job.spec.deadline_s
        late = NO_DEADLINE if deadline is None or job.spec.best_effort else deadline
        rate = known.get(job.job_id) if known is not None else None
        if rate is None:
            rate = cls.speeds(job)
            if known is not None:
                known[job.job_id] = rate
        # Active jobs always have work left; a rounding remainder is still work to plan.
        return cls(job.job_id, max(job.remaining_iterations, 1e-9), late, rate)

    @staticmethod
    def speeds(job: JobView) -> dict[int, float]:
        """Iterations/s of the whole job at each GPU count it may use."""
        spec = job.spec
        cap = artifact_max_gpus(spec.model, spec.batch_size) if spec.scaling else spec.gpus
        rate: dict[int, float] = {}
        for g in spec.gpu_levels:
            if g <= cap:
                scaled = spec.scaling.get(g) if spec.scaling is not None else None
                rate[g] = scaled if scaled is not None else 1.0 / spec.iteration_time_at(g)
        if not rate:  # a cap below every level of the table: its smallest level
            g = spec.gpu_levels[0]
            rate[g] = 1.0 / spec.iteration_time_at(g)
        return rate

    def next_level(self, gpus: int) -> int:
        """The next larger GPU count (the smallest from 0); `gpus` itself at the top."""
        for g in self.levels:
            if g > gpus:
                return g if gpus == 0 or gpus in self.rate else gpus
        return gpus

    def fitting(self, free: int) -> int:
        """The largest GPU count within `free` GPUs, 0 if none (`get_last_level(free + 1)`)."""
        fit = self.fit
        if free >= len(fit):
            return fit[-1]
        return fit[free] if free > 0 else 0


# A free-GPU profile: ascending breakpoints and the free GPUs from each until the next (the
# last value holds for ever). The first breakpoint is the planning instant.
Steps = tuple[list[float], list[int]]


def merged(ts: Sequence[float], vs: Sequence[int]) -> Steps:
    """Drop breakpoints that repeat the previous value (the artifact's `merge_dict`)."""
    changed = [a != b for a, b in zip(vs[1:], vs, strict=False)]
    return ([ts[0], *compress(ts[1:], changed)], [vs[0], *compress(vs[1:], changed)])


@dataclass
class JobPlan:
    """A job's planned GPUs over time (breakpoint → GPUs) and the profile it leaves."""

    met: bool  # the planned (unaligned) end meets the deadline
    alloc: dict[float, int]  # merged, in time order
    end: float  # slot-aligned end: the GPUs are held until here
    real_end: float
    # The profile once the job's GPUs are taken: lists before merging, or the compiled
    # kernel's arrays, already merged. Read only when the plan is committed, so made lazily.
    raw: Steps | tuple[np.ndarray, np.ndarray]
    _merged: Steps | None = None

    @property
    def steps(self) -> Steps:
        if self._merged is None:
            ts, vs = self.raw
            if isinstance(ts, np.ndarray):
                self._merged = ts.tolist(), cast(np.ndarray, vs).tolist()
            else:
                self._merged = merged(ts, cast(list[int], vs))
        return self._merged

    def first_change(self, now: float) -> float | None:
        return next((t for t in self.alloc if t > now), None)


def _merge_alloc(alloc: dict[float, int], in_order: bool = False) -> dict[float, int]:
    """Drop breakpoints that repeat the previous allocation (in time order; `in_order`:
    the dict's keys already are)."""
    if in_order:
        ts, gs = list(alloc), list(alloc.values())
    else:
        items = sorted(alloc.items())
        ts, gs = [t for t, _ in items], [g for _, g in items]
    changed = [a != b for a, b in zip(gs[1:], gs, strict=False)]
    return dict(zip([ts[0], *compress(ts[1:], changed)], [gs[0], *compress(gs[1:], changed)],
                    strict=True))


def gpu_seconds(alloc: Mapping[float, int], end: float) -> float:
    """GPU time of a plan: each breakpoint's GPUs until the next one, the last until `end`."""
    spent = 0.0
    last_t: float | None = None
    last_g = 0
    for t, g in alloc.items():
        if last_t is not None:
            spent += last_g * (t - last_t)
        last_t, last_g = t, g
    assert last_t is not None
    return spent + last_g * (end - last_t)


def _set(ts: list[float], vs: list[int], t: float, v: int) -> None:
    """Profile[t] = v, inserting the breakpoint where it is missing."""
    i = bisect_left(ts, t)
    if i < len(ts) and ts[i] == t:
        vs[i] = v
    else:
        ts.insert(i, t)
        vs.insert(i, v)


def _at(ts: list[float], vs: list[int], t: float) -> int:
    """The profile's value at a breakpoint; between breakpoints (where the artifact would
    fail on a missing key) the value in force, before the first one the first value."""
    i = bisect_right(ts, t) - 1
    return vs[i if i >= 0 else 0]


def _has(ts: Sequence[float], t: float) -> bool:
    i = bisect_left(ts, t)
    return i < len(ts) and ts[i] == t


def plan_mss(need: Need, free: Steps, now: float, total: int, slot: float,
             assign: int | None = None) -> JobPlan:
    """Plan one job into `free` at its minimum satisfactory share (`ef_sim_allocation`).

    With `assign`, the job holds exactly that many GPUs from now until the profile's next
    breakpoint and is planned at its MSS from there (how a leftover GPU level is tried).
    Ends are whole seconds; aligned ends lie on the slot grid from `now`, as every breakpoint
    of the profile does. `free` starts at `now` and is not modified.
    """
    ddl = need.deadline
    left = need.left
    rate = need.rate
    fit = need.fit
    top = len(fit) - 1
    fts, fvs = free
    deadline_at = align_to_slot(now, ddl, slot)
    ts, vs = fts[:], fvs[:]
    last_gpu = total  # the artifact's function-wide `last_event_gpu`, always set before use
    if deadline_at >= now and not _has(ts, deadline_at):
        i = bisect_left(ts, deadline_at)
        last_gpu = vs[i - 1]
        ts.insert(i, deadline_at)
        vs.insert(i, last_gpu)
    alloc: dict[float, int] = {now: 0}
    at = now

    if assign is not None:  # hold `assign` GPUs from now to the next breakpoint
        q = assign
        nxt = fts[1] if len(fts) > 1 else deadline_at
        alloc[now] = q
        real_end = float(math.ceil(now + left / rate[q]))
        end = align_to_slot(now, real_end, slot)
        if nxt >= end and ddl >= real_end:  # it finishes before the profile changes
            last_gpu = vs[0]
            vs[0] -= q
            if not _has(fts, end):
                _set(ts, vs, end, last_gpu)
            return JobPlan(real_end <= ddl, alloc, end, real_end, (ts, vs))
        if nxt < now:
            # Late, alone in the plan: the artifact fails here (a missing breakpoint); the
            # job keeps the assigned GPUs from now until it is done.
            lat = now
            return _beyond(need, q, lat, left, ts, vs, alloc, now, total, slot)
        left -= ((ddl - now) if nxt == deadline_at else (nxt - now)) * rate[q]
        vs[0] -= q
        at = nxt
        alloc[at] = 0
    first = bisect_left(ts, at)  # `at` is a breakpoint

    # 1. The smallest share q that finishes by the deadline, filled back from the deadline.
    quota = need.next_level(0)
    last_quota = 0
    below = bisect_left(ts, deadline_at)  # breakpoints before the deadline: ts[:below]
    if quota and quota <= total:
        # The plan's breakpoints: every one before the deadline, 0 unless given GPUs.
        zeros = dict.fromkeys(ts[:below], 0)
        zeros.update(alloc)
        alloc = zeros
    while quota and quota <= total:
        period_end = deadline_at
        done = 0.0
        widest = 0  # the most GPUs any period could give
        for k in range(below - 1, first - 1, -1):
            p = ts[k]
            v = vs[k]
            f = fit[v] if 0 < v <= top else (fit[top] if v > top else 0)
            if f > widest:
                widest = f
            share = quota if f >= quota else f
            if share == 0:
                period_end = p
                continue
            done += ((ddl - p) if period_end == deadline_at else (period_end - p)) * rate[share]
            if done >= left:
                return _lay_forward(need, free, ts, vs, alloc, first, p, quota, last_quota,
                                    left, deadline_at, total, slot)
            period_end = p
        last_quota, quota = quota, need.next_level(quota)
        if quota == last_quota or widest <= last_quota:
            # Larger shares would give every period the same GPUs and fail the same way.
            break

    # 2. No share meets the deadline: the largest tried, as far as the deadline allows.
    klat = -1
    share = 0
    for k in range(first, len(ts)):
        t = ts[k]
        if t > deadline_at:
            break
        if klat >= 0:
            lat = ts[klat]
            alloc[lat] = share
            vs[klat] -= share
            if share:
                left -= ((ddl - lat) if t == deadline_at else (t - lat)) * rate[share]
        klat = k
        v = vs[k]
        share = fit[v] if 0 < v <= top else (fit[top] if v > top else 0)
        if share > last_quota:
            share = last_quota

    # 3. After the deadline: the largest level that fits, period by period.
    lat = max(deadline_at, at)
    for k in range(bisect_right(ts, deadline_at), len(ts)):
        e = ts[k]
        v = _at(ts, vs, lat)
        q = fit[v] if 0 < v <= top else (fit[top] if v > top else 0)
        alloc[lat] = q
        if q == 0:
            lat = e
            continue
        work = (e - lat) * rate[q]
        if work >= left:
            real_end = float(math.ceil(lat + left / rate[q]))
            end = align_to_slot(now, real_end, slot)
            for j in range(bisect_left(ts, deadline_at), len(ts)):
                u = ts[j]
                if u < end and _has(fts, u):
                    last_gpu = fvs[bisect_left(fts, u)]
                if lat <= u < end:
                    vs[j] -= q
            if lat != end:
                _set(ts, vs, lat, last_gpu - q)
            if not _has(fts, end):
                _set(ts, vs, end, last_gpu)
            return JobPlan(real_end <= ddl, _merge_alloc(alloc), end, real_end, (ts, vs))
        left -= work
        i = bisect_left(fts, lat)  # free's breakpoints before lat: the last one's value now
        if i > 0:
            last_gpu = vs[bisect_left(ts, fts[i - 1])]
        for j in range(bisect_left(ts, lat), bisect_left(ts, e)):
            vs[j] -= q
        lat = e

    # 4. Beyond every breakpoint the whole cluster is free: all the GPUs it can use.
    q = assign if assign is not None else need.fitting(total)
    return _beyond(need, q, lat, left, ts, vs, alloc, now, total, slot)


def _beyond(need: Need, q: int, lat: float, left: float, ts: list[float], vs: list[int],
            alloc: dict[float, int], now: float, total: int, slot: float) -> JobPlan:
    alloc[lat] = q
    real_end = float(math.ceil(lat + left / need.rate[q]))
    end = align_to_slot(now, real_end, slot)
    _set(ts, vs, lat, total - q)
    _set(ts, vs, end, total)
    return JobPlan(real_end <= need.deadline, _merge_alloc(alloc), end, real_end, (ts, vs))


def _lay_forward(need: Need, free: Steps, ts: list[float], vs: list[int],
                 alloc: dict[float, int], first: int, point: float, quota: int,
                 last_quota: int, left: float, deadline_at: float, total: int, slot: float
                 ) -> JobPlan:
    """The plan for share `quota`, found to suffice from `point` on: lay it out from
    breakpoint `first`, periods before `point` at the previous level, until the work is done."""
    ddl = need.deadline
    rate = need.rate
    fit = need.fit
    top = len(fit) - 1
    at = ts[first]
    klat = -1
    share = 0
    end: float | None = None
    real_end = 0.0
    for k in range(first, len(ts)):
        t = ts[k]
        if t > deadline_at:
            break
        if klat >= 0:
            lat = ts[klat]
            alloc[lat] = share
            vs[klat] -= share
            if share:
                work = ((ddl - lat) if t == deadline_at else (t - lat)) * rate[share]
                if lat >= point and work >= left:  # it finishes in this period
                    real_left = math.ceil(left / rate[share])
                    end = lat + align_to_slot(0.0, real_left, slot)
                    real_end = lat + real_left
                    break
                left -= work
        klat = k
        v = vs[k]
        share = fit[v] if 0 < v <= top else (fit[top] if v > top else 0)
        cap = quota if t >= point else last_quota
        if share > cap:
            share = cap
    if end is None:
        lat = ts[klat]
        alloc[lat] = share
        vs[klat] -= share
        real_left = math.ceil(left / rate[share])
        end = lat + align_to_slot(0.0, real_left, slot)
        real_end = lat + real_left
    fts, fvs = free
    j = bisect_left(fts, end) - 1  # free's last breakpoint in [at, end)
    before_end = fvs[j] if j >= 0 and fts[j] >= at else total
    if not _has(fts, end):
        _set(ts, vs, end, before_end)
    # `alloc` holds the breakpoints before the deadline in order, then at most the deadline.
    return JobPlan(real_end <= ddl, _merge_alloc(alloc, in_order=True), end, real_end,
                   (ts, vs))


def plan_all(needs: Sequence[Need], now: float, total: int, slot: float,
             compiled: bool = True) -> tuple[bool, dict[str, JobPlan], Steps]:
    """Plan jobs in the given (deadline) order from an idle cluster (`estimate_all_jobs`):
    whether every one meets its deadline, each one's plan, and the profile left.
    `compiled`: through `policies.elasticflow_kernel` (the same results) when it can."""
    if compiled and needs and _compilable(needs):
        from policies import elasticflow_kernel as kernel

        ok, met, alloc_t, alloc_g, end, real_end, plan_ts, plan_vs, fts, fvs = kernel.plan_all(
            *_need_arrays(needs), *_scalars(now, total, slot))
        made = {need.job_id: _job_plan(met[i], alloc_t[i], alloc_g[i], end[i], real_end[i],
                                       plan_ts[i], plan_vs[i])
                for i, need in enumerate(needs)}
        return bool(ok), made, (fts.tolist(), fvs.tolist())
    free: Steps = ([now], [total])
    plans: dict[str, JobPlan] = {}
    ok = True
    for need in needs:
        plan = plan_mss(need, free, now, total, slot)
        plans[need.job_id] = plan
        free = plan.steps
        ok = ok and plan.met
    return ok, plans, free


def _without(plan: JobPlan, free: Steps) -> Steps:
    """The profile with a job's planned GPUs given back (`get_marginal`'s first half): its
    allocation added on [now, its end), breakpoints at its changes and its end, merged."""
    ts, vs = free[0][:], free[1][:]
    end = plan.end
    for t in (*plan.alloc, end):  # every time is >= now, the first breakpoint
        i = bisect_left(ts, t)
        if i == len(ts) or ts[i] != t:
            ts.insert(i, t)
            vs.insert(i, vs[i - 1])
    stop = bisect_left(ts, end)
    cuts = list(plan.alloc.items())
    for n, (a, g) in enumerate(cuts):
        if g and a < end:
            until = cuts[n + 1][0] if n + 1 < len(cuts) else end
            i, j = bisect_left(ts, a), min(bisect_left(ts, until), stop)
            vs[i:j] = [v + g for v in vs[i:j]]
    return merged(ts, vs)


@dataclass
class Growing:
    """One job during leftover allocation: its GPUs now, its plan, its next step."""

    need: Need
    plan: JobPlan
    gpus: int
    step: int = 0  # the next level's GPU count
    marginal: float = 0.0
    trial: JobPlan | None = None  # its plan at the next level


def allocate_leftover(jobs: list[Growing], free: Steps, now: float, total: int, slot: float,
                      descending: bool = True, compiled: bool = True) -> Steps:
    """Give the GPUs free now to jobs one level at a time by marginal GPU time
    (`allocate_free_gpus`). Reorders `jobs` as the artifact's stable sorts do; returns the
    final profile. `compiled`: run `policies.elasticflow_kernel`'s array version (the same
    results, many times faster) when every job's levels fit its tables.

    A job holding no GPU has marginal +∞ whatever its trial plan, so that plan is made only
    if the job is picked (against the same profile the artifact made it against)."""
    if compiled and jobs and _compilable(job.need for job in jobs):
        return _allocate_leftover_compiled(jobs, free, now, total, slot, descending)
    spare = free[1][0]
    for job in jobs:
        job.step = job.need.next_level(job.gpus)
    if spare == 0:
        return free

    def marginal(job: Growing) -> None:
        job.trial = None
        if job.step - job.gpus > spare or job.step == job.gpus:
            job.marginal = -_TOP
        elif job.gpus == 0:
            job.marginal = _TOP
        else:
            trial = plan_mss(job.need, _without(job.plan, free), now, total, slot,
                             assign=job.step)
            job.trial = trial
            job.marginal = ((gpu_seconds(trial.alloc, trial.end)
                             - gpu_seconds(job.plan.alloc, job.plan.end))
                            / (job.step - job.gpus))

    def order(job: Growing) -> float:
        # Either way a job holding no GPU (+inf) comes first and one that cannot grow last.
        m = job.marginal
        return -m if descending or abs(m) == _TOP else m

    for job in jobs:
        marginal(job)
    jobs.sort(key=order)
    grown = True
    while spare > 0 and grown:
        grown = False
        for job in jobs:
            if job.step - job.gpus > spare or job.step == job.gpus:
                continue
            trial = job.trial or plan_mss(job.need, _without(job.plan, free), now, total,
                                          slot, assign=job.step)
            spare -= job.step - job.gpus
            free = trial.steps
            job.plan, job.gpus, job.trial = trial, job.step, None
            job.step = job.need.next_level(job.gpus)
            grown = True
            break
        for job in jobs:
            if job.step > job.gpus:
                marginal(job)
        jobs.sort(key=order)
    return free


def _compilable(needs: Iterable[Need]) -> bool:
    """Whether the compiled kernel can take these jobs (its tables end at 64 GPUs)."""
    return all(need.levels[-1] <= _TABLE_MAX for need in needs)


NeedArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                   np.ndarray]


def _need_arrays(needs: Sequence[Need]) -> NeedArrays:
    """The kernel's view of the jobs: work, deadline, and rows by GPU count 0 … 64 of speed,
    the largest level within so many free GPUs, whether a count is a level, and the levels."""
    rows = np.fromiter((_ROWS.row_of(need.rate) for need in needs), np.int64, len(needs))
    speed, fit, levels, is_level = (table[rows] for table in _ROWS.tables())
    return (np.array([need.left for need in needs], np.float64),
            np.array([need.deadline for need in needs], np.float64),
            speed, fit, levels, np.array([len(need.levels) for need in needs], np.int64), is_level)


class _RowBank:
    """Every distinct speed table's kernel rows, stacked once, so that a cycle gathers its
    jobs' rows by index (a job keeps one rate dict for life: found by identity, and the
    dict is held so its id is not reused)."""

    _HELD_MAX = 100_000  # rate dicts remembered by identity; a long-lived scheduler forgets

    def __init__(self) -> None:
        self._by_table: dict[tuple[tuple[int, float], ...], int] = {}
        self._by_object: dict[int, tuple[Mapping[int, float], int]] = {}
        self._rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._tables: tuple[np.ndarray, ...] | None = None

    def row_of(self, rate: Mapping[int, float]) -> int:
        held = self._by_object.get(id(rate))
        if held is not None and held[0] is rate:
            return held[1]
        table = tuple(rate.items())
        row = self._by_table.get(table)
        if row is None:
            row = self._by_table[table] = len(self._rows)
            self._rows.append(_kernel_rows(table))
            self._tables = None
        if len(self._by_object) >= self._HELD_MAX:
            self._by_object.clear()
        self._by_object[id(rate)] = (rate, row)
        return row

    def tables(self) -> tuple[np.ndarray, ...]:
        if self._tables is None:
            self._tables = tuple(np.stack([r[k] for r in self._rows]) for k in range(4))
        return self._tables


_ROWS = _RowBank()


def _kernel_rows(rate: tuple[tuple[int, float], ...]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One speed table's rows for the kernel (speed, fit, levels, is-level)."""
    need = Need("", 1.0, 0.0, dict(rate))
    width = _TABLE_MAX + 1
    speed = np.zeros(width)
    fit = np.zeros(width, np.int64)
    levels = np.zeros(width, np.int64)
    is_level = np.zeros(width, np.bool_)
    for g, r in rate:
        speed[g] = r
        is_level[g] = True
    top = len(need.fit) - 1
    fit[:top + 1] = need.fit
    fit[top + 1:] = need.fit[top]
    levels[:len(need.levels)] = need.levels
    return speed, fit, levels, is_level


def _scalars(now: float, total: int, slot: float) -> tuple[float, int, float]:
    """The kernel's scalar arguments with fixed types: numba compiles once per type
    combination (an int `now` would cost another ~20 s compile)."""
    return float(now), int(total), float(slot)


def _job_plan(met: bool, alloc_t: np.ndarray, alloc_g: np.ndarray, end: float, real_end: float,
              ts: np.ndarray, vs: np.ndarray) -> JobPlan:
    """A kernel plan as a JobPlan (its profile stays arrays until it is read)."""
    return JobPlan(bool(met), dict(zip(alloc_t.tolist(), alloc_g.tolist(), strict=True)),
                   float(end), float(real_end), (ts, vs))


def _allocate_leftover_compiled(jobs: list[Growing], free: Steps, now: float, total: int,
                                slot: float, descending: bool) -> Steps:
    """`allocate_leftover` through the compiled kernel: jobs and plans to arrays and back."""
    from policies import elasticflow_kernel as kernel  # numba loads in seconds: only if used

    n = len(jobs)
    width = max(len(job.plan.alloc) for job in jobs)
    plan_t = np.zeros((n, width))
    plan_g = np.zeros((n, width), np.int64)
    for i, job in enumerate(jobs):
        plan_t[i, :len(job.plan.alloc)] = list(job.plan.alloc)
        plan_g[i, :len(job.plan.alloc)] = list(job.plan.alloc.values())
    (order, gpus, alloc_t, alloc_g, end, real_end, met, plan_ts, plan_vs, fts,
     fvs) = kernel.allocate_leftover(
        *_need_arrays([job.need for job in jobs]),
        np.array([job.gpus for job in jobs], np.int64), plan_t, plan_g,
        np.array([len(job.plan.alloc) for job in jobs], np.int64),
        np.array([job.plan.end for job in jobs], np.float64),
        np.array([job.plan.real_end for job in jobs], np.float64),
        np.array([job.plan.met for job in jobs], np.bool_), np.array(free[0], np.float64),
        np.array(free[1], np.int64), *_scalars(now, total, slot), bool(descending))
    for i, job in enumerate(jobs):
        job.step = job.need.next_level(int(gpus[i]))
        job.trial = None
        if gpus[i] != job.gpus:  # it grew: its plan is the kernel's
            job.gpus = int(gpus[i])
            job.plan = _job_plan(met[i], alloc_t[i], alloc_g[i], end[i], real_end[i],
                                 plan_ts[i], plan_vs[i])
    jobs[:] = [jobs[i] for i in order]
    return fts.tolist(), fvs.tolist()


@dataclass(frozen=True)
class Allotted:
    """A job after a cycle's planning: its GPUs now, and when its plan next changes them."""

    need: Need
    gpus: int
    next_change: float | None


@cache
def _cycle_kernel() -> elasticflow_aot.CycleKernel:
    """`plan_cycle`'s kernel, loaded on first use: compiled ahead of time where
    `scripts/setup` built it, else through numba's JIT (about 0.5 s more to load)."""
    return elasticflow_aot.plan_cycle()


def plan_cycle(needs: Sequence[Need], now: float, total: int, slot: float, *,
               descending: bool = True, all_met: bool = False,
               compiled: bool = True) -> list[Allotted] | None:
    """A whole cycle: the jobs planned at their MSS in the given (deadline) order, then the
    GPUs left free handed out (`allocate_leftover`); the jobs come back in its final order.
    `all_met`: None instead if any job would miss its deadline (an admission check).
    `compiled`: in one call to `policies.elasticflow_kernel` (the same results) when it can."""
    if compiled and needs and _compilable(needs):
        ok, order, gpus, changes = _cycle_kernel()(
            *_need_arrays(needs), *_scalars(now, total, slot), bool(descending), bool(all_met))
        if not ok and all_met:
            return None
        return [Allotted(needs[i], g, None if math.isnan(t) else t)
                for i, g, t in zip(order.tolist(), gpus[order].tolist(),
                                   changes[order].tolist(), strict=True)]
    ok, plans, free = plan_all(needs, now, total, slot, compiled=False)
    if not ok and all_met:
        return None
    jobs = [Growing(n, plans[n.job_id], plans[n.job_id].alloc[now]) for n in needs]
    allocate_leftover(jobs, free, now, total, slot, descending, compiled=False)
    return [Allotted(j.need, j.gpus, j.plan.first_change(now)) for j in jobs]


class ElasticFlow(Policy):
    name = "elasticflow"
    description = ("ElasticFlow: admission by minimum satisfactory share, elastic scaling, "
                   "spare GPUs by marginal return")
    placement = "count"
    replan = "slot"
    leftover_order: ClassVar[Literal["descending", "ascending"]] = "descending"

    def __init__(self) -> None:
        self.slot_s = 60.0
        self._order: list[str] = []  # admitted jobs, in the artifact's `runnable_jobs` order
        self._admitted: set[str] = set()
        self._status: dict[str, Status] = {}
        self._speeds: dict[str, Mapping[int, float]] = {}  # each active job's, by job id
        self.accepted = 0
        self.declined = 0

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None) -> None:
        self.slot_s = round_s

    def job_removed(self, job_id: str) -> None:
        if job_id in self._admitted:
            self._admitted.discard(job_id)
            self._order.remove(job_id)
        self._status.pop(job_id, None)
        self._speeds.pop(job_id, None)

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        now, total, slot = snap.now, snap.cluster.total_gpus, self.slot_s
        needs = {jid: Need.of(job, self._speeds) for jid, job in snap.jobs.items()}
        arrived = [jid for jid in snap.jobs if jid not in self._admitted]
        declined: dict[str, str] = {}
        descending = self.leftover_order == "descending"
        jobs: list[Allotted] | None = None
        if arrived:
            # Planned with the newcomers, in the deadline order they would then have.
            trial = _by_deadline(self._order + arrived, needs)
            jobs = plan_cycle([needs[j] for j in trial], now, total, slot,
                              descending=descending, all_met=True)
            if jobs is not None:
                self._admit(arrived)
            else:
                admitted = [j for j in arrived if needs[j].deadline == NO_DEADLINE]
                self._admit(admitted)
                reason = (f"a deadline would be missed if the {len(arrived)} job(s) arriving "
                          "now were admitted" if len(arrived) > 1 else
                          "its deadline cannot be met beside the admitted jobs")
                for jid in arrived:
                    if jid not in self._admitted:
                        declined[jid] = reason
                        self.declined += 1
        self._order = _by_deadline(self._order, needs)
        if jobs is None:
            jobs = plan_cycle([needs[j] for j in self._order], now, total, slot,
                              descending=descending)
            assert jobs is not None
        jobs.sort(key=lambda g: -g.gpus)  # the artifact places the largest jobs first
        self._order = [g.need.job_id for g in jobs]
        return self._place(snap, fit, jobs, declined)

    def _admit(self, job_ids: Iterable[str]) -> None:
        for jid in job_ids:
            self._admitted.add(jid)
            self._order.append(jid)
            self.accepted += 1

    def _place(self, snap: Snapshot, fit: Fitter, jobs: list[Allotted],
               declined: dict[str, str]) -> Plan:
        plan = Plan(declined=declined)
        self._status = {}
        # Jobs keeping their GPU count first, so they keep their GPUs (no restart).
        keep: list[Allotted] = []
        change: list[Allotted] = []
        for g in jobs:
            if g.gpus:
                same = snap.jobs[g.need.job_id].allocated == g.gpus
                (keep if same else change).append(g)
        for g in keep + change:
            jid = g.need.job_id
            slots = None
            # Count placement fits whatever the plan gave out; a topology-aware placement
            # (--placement) may refuse a gang, and the job then takes a smaller level.
            for size in (x for x in reversed(g.need.levels) if x <= g.gpus):
                slots = fit.try_place(jid, size)
                if slots is not None:
                    break
            if slots is None:
                self._status[jid] = Status(
                    code=StatusCode.WAITING_FOR_CONSOLIDATED_GPUS, reason=fit.explain(g.gpus),
                    decided_by=self.name)
                continue
            plan.run[jid] = slots
        waiting = (g for g in jobs if not g.gpus)
        for position, g in enumerate(waiting, start=1):
            starts = g.next_change
            reason = ("its plan starts it when the GPUs free up" if starts is None else
                      f"its plan starts it at t={starts:g}")
            self._status[g.need.job_id] = Status(
                code=StatusCode.WAITING_FOR_PRIORITY, reason=reason, decided_by=self.name,
                queue_position=position)
        changes = [g.next_change for g in jobs if g.next_change is not None]
        plan.wakeup_at = min(changes) if changes else None
        plan.free_gpus = fit.free_gpus
        return plan

    def waiting_status(self, job_id: str) -> Status:
        return self._status.get(job_id, Status(
            code=StatusCode.WAITING_FOR_PRIORITY, reason="waiting for the next slot",
            decided_by=self.name))


def _by_deadline(job_ids: Iterable[str], needs: Mapping[str, Need]) -> list[str]:
    """Stable deadline order (ties keep their order, as the artifact's list sorts do)."""
    return sorted(job_ids, key=lambda j: needs[j].deadline)


__all__ = ["NO_DEADLINE", "Allotted", "ElasticFlow", "Growing", "JobPlan", "Need", "Steps",
           "allocate_leftover", "artifact_max_gpus", "gpu_seconds", "plan_all", "plan_cycle",
           "plan_mss"]
