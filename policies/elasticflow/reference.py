"""ElasticFlow's planner, readable: the artifact's `ef_sim_allocation`, `estimate_all_jobs`
and `allocate_free_gpus` step for step.

The admitted jobs are planned into a profile of free GPUs over time, in deadline order, each
at its *minimum satisfactory share* (MSS): for the GPU counts q = 1, 2, 4, … of its throughput
table, the planner walks the free-GPU profile backwards from the deadline, giving the job
min(q, the largest level that fits) GPUs in each period, until the work done reaches the job's
remaining iterations; the first q that gets there is the job's share, and its plan is then
laid forward from now (earlier periods at the previous level, later ones at q). A job that
cannot finish by its deadline at any level runs after the deadline with what is left, then
with all the GPUs it can use.

The GPUs the plans leave free now are handed out one level at a time by marginal return
(`allocate_leftover`): for every job that can grow by one level within the free GPUs, the
job is re-planned with that many GPUs from now, and its marginal is the change in the GPU time
of its plan per added GPU (jobs holding no GPU first). The job with the *largest* marginal
gets its next level (the artifact's order: see `policies.elasticflow.policy`); marginals are
recomputed, until no GPU is left or no job can grow.

Every step is the artifact's, including its float summation order, its ends rounded up to
whole seconds and slots, and its stable sorts; docs/validation.md ("ElasticFlow") has the
check against the artifact's own plans. Where the artifact would fail (a late job alone in the
plan, whose trial needs a breakpoint the profile lacks) the job keeps the assigned GPUs until
done. The fast path (`policies.elasticflow.fast`) gives the same results bit for bit.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import compress

from policies.edf import align_to_slot
from policies.elasticflow.model import Allotted, Growing, JobPlan, Need, Steps, gpu_seconds, merged

_TOP = float(sys.maxsize)  # the artifact's ±infinite marginal


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


def plan_all(needs: Sequence[Need], now: float, total: int, slot: float
             ) -> tuple[bool, dict[str, JobPlan], Steps]:
    """Plan jobs in the given (deadline) order from an idle cluster (`estimate_all_jobs`):
    whether every one meets its deadline, each one's plan, and the profile left."""
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


def allocate_leftover(jobs: list[Growing], free: Steps, now: float, total: int, slot: float,
                      descending: bool = True) -> Steps:
    """Give the GPUs free now to jobs one level at a time by marginal GPU time
    (`allocate_free_gpus`). Reorders `jobs` as the artifact's stable sorts do; returns the
    final profile.

    A job holding no GPU has marginal +∞ whatever its trial plan, so that plan is made only
    if the job is picked (against the same profile the artifact made it against)."""
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


def plan_cycle(needs: Sequence[Need], now: float, total: int, slot: float, *,
               descending: bool = True, all_met: bool = False) -> list[Allotted] | None:
    """A whole cycle: the jobs planned at their MSS in the given (deadline) order, then the
    GPUs left free handed out (`allocate_leftover`); the jobs come back in its final order.
    `all_met`: None instead if any job would miss its deadline (an admission check)."""
    ok, plans, free = plan_all(needs, now, total, slot)
    if not ok and all_met:
        return None
    jobs = [Growing(n, plans[n.job_id], plans[n.job_id].alloc[now]) for n in needs]
    allocate_leftover(jobs, free, now, total, slot, descending)
    return [Allotted(j.need, j.gpus, j.plan.first_change(now)) for j in jobs]
