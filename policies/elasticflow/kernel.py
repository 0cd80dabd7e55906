# Over 450 lines because it is one kernel: the reference planner's arithmetic, kept together.
"""ElasticFlow's planner compiled by numba: the reference planner's functions on arrays.

`policies.elasticflow.reference` is the readable planner, ported step by step from the
artifact; this module is the same arithmetic on flat arrays so that numba can compile it,
because the leftover allocation re-plans every growable job after every single growth
(thousands of trial plans per cycle on large clusters; docs/validation.md has what that cost
in Python). Every operation and its order is kept, floats included (Python's float divmod and
ceil are reproduced), so the two give identical GPU counts, plans and job order;
`tests/policies/elasticflow/test_fast.py` checks that on random cases. Compiled once per
machine (numba's cache); with NUMBA_DISABLE_JIT=1 the same functions run as plain Python.

Layout: a profile is a pair of arrays (breakpoint times, free GPUs from each). A job's needs
are rows of tables indexed by GPU count 0 … 64 (`rate`, `fit`, `is_level`). A plan's
allocation is two arrays (times, GPUs), merged and in time order; inside the planner it is one
value per profile breakpoint (-1: not a key of the artifact's dict).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

TABLE = 65  # GPU counts 0 … 64 (the throughput tables' largest count)
TOP = float(9223372036854775807)  # the artifact's ±infinite marginal (sys.maxsize)

F64 = np.float64
I64 = np.int64


@njit(cache=True)
def py_floor_divmod(vx: float, wx: float) -> tuple[float, float]:
    """CPython's float divmod, operation for operation."""
    mod = np.fmod(vx, wx)  # C fmod, as math.fmod (which numba lacks)
    div = (vx - mod) / wx
    if mod != 0.0:
        if (wx < 0.0) != (mod < 0.0):
            mod += wx
            div -= 1.0
    else:
        mod = math.copysign(0.0, wx)
    if div != 0.0:
        floordiv = math.floor(div)
        if div - floordiv > 0.5:
            floordiv += 1.0
    else:
        floordiv = math.copysign(0.0, vx / wx)
    return floordiv, mod


@njit(cache=True)
def align(start: float, t: float, slot: float) -> float:
    n, rest = py_floor_divmod(t - start, slot)
    return start + (n + (1.0 if rest > 0.0 else 0.0)) * slot


@njit(cache=True)
def bisect_left(a: Any, x: float) -> int:
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def bisect_right(a: Any, x: float) -> int:
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def has(a: Any, x: float) -> bool:
    i = bisect_left(a, x)
    return i < len(a) and a[i] == x


@njit(cache=True, inline="always")
def insert(ts: Any, vs: Any, i: int, t: float, v: int) -> tuple[Any, Any]:
    n = len(ts)
    nts = np.empty(n + 1, F64)
    nvs = np.empty(n + 1, I64)
    nts[:i] = ts[:i]
    nvs[:i] = vs[:i]
    nts[i] = t
    nvs[i] = v
    nts[i + 1:] = ts[i:]
    nvs[i + 1:] = vs[i:]
    return nts, nvs


@njit(cache=True, inline="always")
def set_at(ts: Any, vs: Any, t: float, v: int) -> tuple[Any, Any]:
    """Profile[t] = v, inserting the breakpoint where it is missing."""
    i = bisect_left(ts, t)
    if i < len(ts) and ts[i] == t:
        vs[i] = v
        return ts, vs
    return insert(ts, vs, i, t, v)


@njit(cache=True, inline="always")
def merged(ts: Any, vs: Any) -> tuple[Any, Any]:
    """Drop breakpoints that repeat the previous value (into new arrays)."""
    mts = np.empty(len(ts), F64)
    mvs = np.empty(len(ts), I64)
    m = 0
    for i in range(len(ts)):
        if m == 0 or vs[i] != mvs[m - 1]:
            mts[m] = ts[i]
            mvs[m] = vs[i]
            m += 1
    return mts[:m], mvs[:m]


@njit(cache=True)
def fit_of(fit: Any, v: int) -> Any:
    """The largest level within `v` free GPUs (0: none)."""
    if v <= 0:
        return 0
    return fit[v] if v < TABLE else fit[TABLE - 1]


@njit(cache=True)
def next_level(levels: Any, is_level: Any, gpus: int) -> int:
    for g in levels:
        if g > gpus:
            return g if gpus == 0 or is_level[gpus] else gpus
    return gpus


@njit(cache=True)
def gpu_seconds(at: Any, ag: Any, end: float) -> Any:
    spent = 0.0
    for k in range(1, len(at)):
        spent += ag[k - 1] * (at[k] - at[k - 1])
    return spent + ag[-1] * (end - at[-1])


@njit(cache=True, inline="always")
def keyed_alloc(ts: Any, a: Any) -> tuple[Any, Any]:
    """The plan's allocation from its per-breakpoint values, in time order, merged."""
    at = np.empty(len(a), F64)
    ag = np.empty(len(a), I64)
    m = 0
    for k in range(len(a)):
        if a[k] >= 0 and (m == 0 or a[k] != ag[m - 1]):
            at[m] = ts[k]
            ag[m] = a[k]
            m += 1
    return at[:m], ag[:m]


@njit(cache=True, inline="always")
def beyond(rate: Any, ddl: float, q: int, lat_i: int, left: float, ts: Any, vs: Any, a: Any,
           now: float, total: int, slot: float) -> Any:
    lat = ts[lat_i]
    a[lat_i] = q
    real_end = math.ceil(lat + left / rate[q]) * 1.0
    end = align(now, real_end, slot)
    at, ag = keyed_alloc(ts, a)
    ts, vs = set_at(ts, vs, lat, total - q)
    ts, vs = set_at(ts, vs, end, total)
    return real_end <= ddl, at, ag, end, real_end, ts, vs


@njit(cache=True)
def lay_forward(rate: Any, fit: Any, ddl: float, fts: Any, fvs: Any, ts: Any, vs: Any,
                a: Any, first: int, point: float, quota: int, last_quota: int, left: float,
                deadline_at: float, total: int, slot: float) -> Any:
    at0 = ts[first]
    klat = -1
    share = 0
    found = False
    end = 0.0
    real_end = 0.0
    for k in range(first, len(ts)):
        t = ts[k]
        if t > deadline_at:
            break
        if klat >= 0:
            lat = ts[klat]
            a[klat] = share
            vs[klat] -= share
            if share:
                work = ((ddl - lat) if t == deadline_at else (t - lat)) * rate[share]
                if lat >= point and work >= left:
                    real_left = math.ceil(left / rate[share]) * 1.0
                    end = lat + align(0.0, real_left, slot)
                    real_end = lat + real_left
                    found = True
                    break
                left -= work
        klat = k
        share = fit_of(fit, vs[k])
        cap = quota if t >= point else last_quota
        if share > cap:
            share = cap
    if not found:
        lat = ts[klat]
        a[klat] = share
        vs[klat] -= share
        real_left = math.ceil(left / rate[share]) * 1.0
        end = lat + align(0.0, real_left, slot)
        real_end = lat + real_left
    j = bisect_left(fts, end) - 1
    before_end = fvs[j] if j >= 0 and fts[j] >= at0 else total
    at, ag = keyed_alloc(ts, a)
    if not has(fts, end):
        ts, vs = set_at(ts, vs, end, before_end)
    return real_end <= ddl, at, ag, end, real_end, ts, vs


@njit(cache=True)
def plan_mss(left: float, ddl: float, rate: Any, fit: Any, levels: Any, is_level: Any,
             fts: Any, fvs: Any, now: float, total: int, slot: float,
             assign: int) -> Any:
    """`reference.plan_mss` (assign < 0: none): (met, alloc times, alloc GPUs,
    end, real end, profile times, profile values)."""
    deadline_at = align(now, ddl, slot)
    ts, vs = fts.copy(), fvs.copy()
    last_gpu = total
    if deadline_at >= now and not has(ts, deadline_at):
        i = bisect_left(ts, deadline_at)
        last_gpu = vs[i - 1]
        ts, vs = insert(ts, vs, i, deadline_at, last_gpu)
    a = np.full(len(ts), -1, I64)  # alloc: value per breakpoint
    a[0] = 0
    at_i = 0

    if assign >= 0:
        q = assign
        nxt = fts[1] if len(fts) > 1 else deadline_at
        a[0] = q
        real_end = math.ceil(now + left / rate[q]) * 1.0
        end = align(now, real_end, slot)
        if nxt >= end and ddl >= real_end:
            last_gpu = vs[0]
            vs[0] -= q
            at, ag = keyed_alloc(ts, a)
            if not has(fts, end):
                ts, vs = set_at(ts, vs, end, last_gpu)
            return real_end <= ddl, at, ag, end, real_end, ts, vs
        if nxt < now:
            return beyond(rate, ddl, q, 0, left, ts, vs, a, now, total, slot)
        left -= ((ddl - now) if nxt == deadline_at else (nxt - now)) * rate[q]
        vs[0] -= q
        at_i = bisect_left(ts, nxt)
        a[at_i] = 0
    first = at_i
    at_t = ts[at_i]

    quota = next_level(levels, is_level, 0)
    last_quota = 0
    below = bisect_left(ts, deadline_at)
    if quota and quota <= total:
        for k in range(below):
            if a[k] < 0:
                a[k] = 0
    while quota and quota <= total:
        period_end = deadline_at
        done = 0.0
        widest = 0
        for k in range(below - 1, first - 1, -1):
            p = ts[k]
            f = fit_of(fit, vs[k])
            if f > widest:
                widest = f
            share = quota if f >= quota else f
            if share == 0:
                period_end = p
                continue
            done += ((ddl - p) if period_end == deadline_at else (period_end - p)) * rate[share]
            if done >= left:
                return lay_forward(rate, fit, ddl, fts, fvs, ts, vs, a, first, p, quota,
                                   last_quota, left, deadline_at, total, slot)
            period_end = p
        last_quota, quota = quota, next_level(levels, is_level, quota)
        if quota == last_quota or widest <= last_quota:
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
            a[klat] = share
            vs[klat] -= share
            if share:
                left -= ((ddl - lat) if t == deadline_at else (t - lat)) * rate[share]
        klat = k
        share = fit_of(fit, vs[k])
        if share > last_quota:
            share = last_quota

    # 3. After the deadline: the largest level that fits, period by period.
    lat = deadline_at if deadline_at > at_t else at_t
    lat_i = bisect_left(ts, lat)
    for k in range(bisect_right(ts, deadline_at), len(ts)):
        e = ts[k]
        q = fit_of(fit, vs[bisect_right(ts, lat) - 1])
        a[lat_i] = q
        if q == 0:
            lat, lat_i = e, k
            continue
        work = (e - lat) * rate[q]
        if work >= left:
            real_end = math.ceil(lat + left / rate[q]) * 1.0
            end = align(now, real_end, slot)
            for j in range(bisect_left(ts, deadline_at), len(ts)):
                u = ts[j]
                if u < end and has(fts, u):
                    last_gpu = fvs[bisect_left(fts, u)]
                if lat <= u < end:
                    vs[j] -= q
            at, ag = keyed_alloc(ts, a)
            if lat != end:
                ts, vs = set_at(ts, vs, lat, last_gpu - q)
            if not has(fts, end):
                ts, vs = set_at(ts, vs, end, last_gpu)
            return real_end <= ddl, at, ag, end, real_end, ts, vs
        left -= work
        i = bisect_left(fts, lat)
        if i > 0:
            last_gpu = vs[bisect_left(ts, fts[i - 1])]
        for j in range(bisect_left(ts, lat), bisect_left(ts, e)):
            vs[j] -= q
        lat, lat_i = e, k

    # 4. Beyond every breakpoint the whole cluster is free: all the GPUs it can use.
    q = assign if assign >= 0 else fit_of(fit, total)
    return beyond(rate, ddl, q, lat_i, left, ts, vs, a, now, total, slot)


@njit(cache=True, inline="always")
def without(at: Any, ag: Any, end: float, fts: Any, fvs: Any) -> tuple[Any, Any]:
    """The profile with a plan's GPUs given back, merged (`reference._without`),
    in one pass: the profile's breakpoints, the plan's and its end, each once and in order (a
    new one takes the value of the profile's segment it falls in; every plan starts now, the
    profile's first breakpoint), the plan's GPUs added where it holds them before its end,
    repeats dropped."""
    n, na = len(fts), len(at)
    # The plan's times with its end among them (the end may precede the last time).
    e = bisect_left(at, end)
    if e < na and at[e] == end:
        pts = at.copy()
    else:
        pts = np.empty(na + 1, F64)
        pts[:e] = at[:e]
        pts[e] = end
        pts[e + 1:] = at[e:]
    npts = len(pts)
    ts = np.empty(n + na + 1, F64)
    vs = np.empty(n + na + 1, I64)
    i = 0  # next profile breakpoint
    p = 0  # next plan breakpoint
    seg = -1  # the plan's segment holding the current time (-1: before the plan)
    m = 0
    while i < n or p < npts:
        u = pts[p] if p < npts else np.inf
        t = fts[i] if i < n else np.inf
        if t <= u:
            time, value = t, fvs[i]
            i += 1
            if t == u:
                p += 1
        else:
            time, value = u, fvs[i - 1]  # i >= 1: u >= fts[0]
            p += 1
        while seg + 1 < na and at[seg + 1] <= time:
            seg += 1
        if seg >= 0 and time < end and ag[seg] and at[seg] < end:
            value += ag[seg]
        if m == 0 or value != vs[m - 1]:
            ts[m] = time
            vs[m] = value
            m += 1
    return ts[:m], vs[:m]


@njit(cache=True)
def plan_all(left: Any, ddl: Any, rate: Any, fit: Any, levels: Any, nlev: Any, is_level: Any,
             now: float, total: int, slot: float) -> Any:
    """`reference.plan_all` on arrays: every job at its MSS in the given order,
    each into what the previous left. Returns (all met, each plan's met, allocation times and
    GPUs, end, real end, the profile it left) and the final profile."""
    n = len(left)
    fts = np.array([now])
    fvs = np.array([total], I64)
    met = np.zeros(n, np.bool_)
    end = np.zeros(n, F64)
    real_end = np.zeros(n, F64)
    at_l = [np.empty(0, F64) for _ in range(n)]
    ag_l = [np.empty(0, I64) for _ in range(n)]
    pl_ts = [np.empty(0, F64) for _ in range(n)]
    pl_vs = [np.empty(0, I64) for _ in range(n)]
    ok = True
    for i in range(n):
        met[i], at_l[i], ag_l[i], end[i], real_end[i], ts, vs = plan_mss(
            left[i], ddl[i], rate[i], fit[i], levels[i, :nlev[i]], is_level[i], fts, fvs, now,
            total, slot, -1)
        fts, fvs = merged(ts, vs)
        pl_ts[i], pl_vs[i] = fts, fvs
        ok = ok and met[i]
    return ok, met, at_l, ag_l, end, real_end, pl_ts, pl_vs, fts, fvs


@njit(cache=True, inline="always")
def trial(i: Any, left: Any, ddl: Any, rate: Any, fit: Any, levels: Any, nlev: Any,
          is_level: Any, at: Any, ag: Any, end: float, fts: Any, fvs: Any, now: float,
          total: int, slot: float, step: int) -> Any:
    """Job i re-planned holding `step` GPUs from now, its own GPUs given back first: (met,
    alloc times, alloc GPUs, end, real end, profile times, values). The profile is left
    unmerged: most trials only price a growth, and only the chosen one's profile is kept."""
    wt, wv = without(at, ag, end, fts, fvs)
    return plan_mss(left[i], ddl[i], rate[i], fit[i], levels[i, :nlev[i]], is_level[i], wt, wv,
                    now, total, slot, step)


@njit(cache=True)
def sort_key(marginal: Any, order: Any, descending: bool) -> Any:
    """The artifact's stable sort of the jobs by marginal (largest first when descending;
    either way +inf, a job holding no GPU, first and -inf, one that cannot grow, last)."""
    keys = np.empty(len(order), F64)
    for k in range(len(order)):
        m = marginal[order[k]]
        keys[k] = -m if descending or abs(m) == TOP else m
    return order[np.argsort(keys, kind="mergesort")]


@njit(cache=True)
def allocate_leftover(left: Any, ddl: Any, rate: Any, fit: Any, levels: Any, nlev: Any,
                      is_level: Any, gpus: Any, plan_t: Any, plan_g: Any, plan_len: Any,
                      plan_end: Any, plan_real_end: Any, plan_met: Any, fts: Any, fvs: Any,
                      now: float, total: int, slot: float,
                      descending: bool) -> Any:
    """`reference.allocate_leftover` on arrays. Returns the final job order (as
    indices), GPUs per job, each job's plan (allocation times and GPUs, end, real end, met,
    and for a job that grew the profile its plan left, else empty) and the final profile."""
    n = len(left)
    at_l = [plan_t[i, :plan_len[i]].copy() for i in range(n)]
    ag_l = [plan_g[i, :plan_len[i]].copy() for i in range(n)]
    end = plan_end.copy()
    real_end = plan_real_end.copy()
    met = plan_met.copy()
    gpus = gpus.copy()
    step = np.empty(n, I64)
    marginal = np.zeros(n, F64)
    # Each job's trial plan at its next level, valid while has_trial.
    has_trial = np.zeros(n, np.bool_)
    tr_at = [np.empty(0, F64) for _ in range(n)]
    tr_ag = [np.empty(0, I64) for _ in range(n)]
    tr_end = np.zeros(n, F64)
    tr_real = np.zeros(n, F64)
    tr_met = np.zeros(n, np.bool_)
    tr_ts = [np.empty(0, F64) for _ in range(n)]
    tr_vs = [np.empty(0, I64) for _ in range(n)]
    pl_ts = [np.empty(0, F64) for _ in range(n)]  # the profile each grown job's plan left
    pl_vs = [np.empty(0, I64) for _ in range(n)]
    order = np.arange(n)
    spare = fvs[0]
    for j in range(n):
        step[j] = next_level(levels[j, :nlev[j]], is_level[j], gpus[j])
    if spare == 0:
        return order, gpus, at_l, ag_l, end, real_end, met, pl_ts, pl_vs, fts, fvs

    # Marginals (all at first, then of the jobs that can still grow) and the stable sort;
    # then the first job in that order that fits grows one level. A round that grows
    # nothing would recompute the same marginals and keep the order, so it ends the loop.
    refresh = np.ones(n, np.bool_)
    while True:
        for i in order:  # in the current order, as the artifact computes them
            if not refresh[i]:
                continue
            has_trial[i] = False
            if step[i] - gpus[i] > spare or step[i] == gpus[i]:
                marginal[i] = -TOP
            elif gpus[i] == 0:
                marginal[i] = TOP
            else:
                (tr_met[i], tr_at[i], tr_ag[i], tr_end[i], tr_real[i], tr_ts[i],
                 tr_vs[i]) = trial(i, left, ddl, rate, fit, levels, nlev, is_level, at_l[i],
                                   ag_l[i], end[i], fts, fvs, now, total, slot, step[i])
                has_trial[i] = True
                marginal[i] = ((gpu_seconds(tr_at[i], tr_ag[i], tr_end[i])
                                - gpu_seconds(at_l[i], ag_l[i], end[i])) / (step[i] - gpus[i]))
        order = sort_key(marginal, order, descending)
        if spare <= 0:
            break
        grown = False
        for i in order:
            if step[i] - gpus[i] > spare or step[i] == gpus[i]:
                continue
            if not has_trial[i]:  # a job holding no GPU: its trial is made only now
                (tr_met[i], tr_at[i], tr_ag[i], tr_end[i], tr_real[i], tr_ts[i],
                 tr_vs[i]) = trial(i, left, ddl, rate, fit, levels, nlev, is_level,
                                   at_l[i], ag_l[i], end[i], fts, fvs, now, total, slot,
                                   step[i])
            spare -= step[i] - gpus[i]
            fts, fvs = merged(tr_ts[i], tr_vs[i])
            at_l[i], ag_l[i] = tr_at[i], tr_ag[i]
            pl_ts[i], pl_vs[i] = fts, fvs
            end[i], real_end[i], met[i] = tr_end[i], tr_real[i], tr_met[i]
            gpus[i] = step[i]
            has_trial[i] = False
            step[i] = next_level(levels[i, :nlev[i]], is_level[i], gpus[i])
            grown = True
            break
        if not grown:
            break
        for j in range(n):
            refresh[j] = step[j] > gpus[j]
    return order, gpus, at_l, ag_l, end, real_end, met, pl_ts, pl_vs, fts, fvs


@njit(cache=True)
def plan_cycle(left: Any, ddl: Any, rate: Any, fit: Any, levels: Any, nlev: Any,
               is_level: Any, now: float, total: int, slot: float, descending: bool,
               all_met: bool) -> Any:
    """One ElasticFlow cycle, `plan_all` then `allocate_leftover`, with the plans passed
    between them as arrays. `all_met`: give up (ok False, empty results) if a job would miss
    its deadline (an admission check). Returns (ok, the final job order as indices, each
    job's GPUs now, the first time after now its plan changes them, NaN if never)."""
    ok, met, at_l, ag_l, end, real_end, _, _, fts, fvs = plan_all(
        left, ddl, rate, fit, levels, nlev, is_level, now, total, slot)
    n = len(left)
    if all_met and not ok:
        return False, np.empty(0, I64), np.empty(0, I64), np.empty(0, F64)
    width = 1
    for i in range(n):
        width = max(width, len(at_l[i]))
    plan_t = np.zeros((n, width), F64)
    plan_g = np.zeros((n, width), I64)
    plan_len = np.empty(n, I64)
    gpus = np.empty(n, I64)
    for i in range(n):
        k = len(at_l[i])
        plan_t[i, :k] = at_l[i]
        plan_g[i, :k] = ag_l[i]
        plan_len[i] = k
        gpus[i] = ag_l[i][0]  # a plan's first breakpoint is now
    order, gpus, at_l, _, _, _, _, _, _, _, _ = allocate_leftover(
        left, ddl, rate, fit, levels, nlev, is_level, gpus, plan_t, plan_g, plan_len, end,
        real_end, met, fts, fvs, now, total, slot, descending)
    changes = np.full(n, np.nan)
    for i in range(n):
        for t in at_l[i]:
            if t > now:
                changes[i] = t
                break
    return ok, order, gpus, changes
