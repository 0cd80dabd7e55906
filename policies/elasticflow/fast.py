"""ElasticFlow's planner, fast: the reference planner's arithmetic on arrays, compiled by numba
(`policies.elasticflow.kernel`), with the conversions to and from the planner's model here.

It gives what `policies.elasticflow.reference` gives, bit for bit (plans, GPU counts, job
order, profiles: tests/policies/elasticflow/test_fast.py), for the jobs it `takes`. A cycle is
one kernel call, compiled ahead of time where `scripts/setup` built it
(`policies.elasticflow.aot`), else through numba's JIT.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cache

import numpy as np

from policies.elasticflow import aot
from policies.elasticflow.model import (
    TABLE_MAX,
    Allotted,
    Growing,
    JobPlan,
    Need,
    Steps,
)


def takes(needs: Sequence[Need]) -> bool:
    """Whether the kernel can plan these jobs: some, each with its levels within the kernel's
    tables (64 GPUs)."""
    return bool(needs) and all(need.levels[-1] <= TABLE_MAX for need in needs)


def plan_all(needs: Sequence[Need], now: float, total: int, slot: float
             ) -> tuple[bool, dict[str, JobPlan], Steps]:
    """`reference.plan_all` through the kernel."""
    from policies.elasticflow import kernel  # numba loads in seconds: only if used

    ok, met, alloc_t, alloc_g, end, real_end, plan_ts, plan_vs, fts, fvs = kernel.plan_all(
        *need_arrays(needs), *scalars(now, total, slot))
    made = {need.job_id: _job_plan(met[i], alloc_t[i], alloc_g[i], end[i], real_end[i],
                                   plan_ts[i], plan_vs[i])
            for i, need in enumerate(needs)}
    return bool(ok), made, (fts.tolist(), fvs.tolist())


def allocate_leftover(jobs: list[Growing], free: Steps, now: float, total: int, slot: float,
                      descending: bool = True) -> Steps:
    """`reference.allocate_leftover` through the kernel: jobs and plans to arrays and back."""
    from policies.elasticflow import kernel  # numba loads in seconds: only if used

    n = len(jobs)
    width = max(len(job.plan.alloc) for job in jobs)
    plan_t = np.zeros((n, width))
    plan_g = np.zeros((n, width), np.int64)
    for i, job in enumerate(jobs):
        plan_t[i, :len(job.plan.alloc)] = list(job.plan.alloc)
        plan_g[i, :len(job.plan.alloc)] = list(job.plan.alloc.values())
    (order, gpus, alloc_t, alloc_g, end, real_end, met, plan_ts, plan_vs, fts,
     fvs) = kernel.allocate_leftover(
        *need_arrays([job.need for job in jobs]),
        np.array([job.gpus for job in jobs], np.int64), plan_t, plan_g,
        np.array([len(job.plan.alloc) for job in jobs], np.int64),
        np.array([job.plan.end for job in jobs], np.float64),
        np.array([job.plan.real_end for job in jobs], np.float64),
        np.array([job.plan.met for job in jobs], np.bool_), np.array(free[0], np.float64),
        np.array(free[1], np.int64), *scalars(now, total, slot), bool(descending))
    for i, job in enumerate(jobs):
        job.step = job.need.next_level(int(gpus[i]))
        job.trial = None
        if gpus[i] != job.gpus:  # it grew: its plan is the kernel's
            job.gpus = int(gpus[i])
            job.plan = _job_plan(met[i], alloc_t[i], alloc_g[i], end[i], real_end[i],
                                 plan_ts[i], plan_vs[i])
    jobs[:] = [jobs[i] for i in order]
    return fts.tolist(), fvs.tolist()


@cache
def _cycle_kernel() -> aot.CycleKernel:
    """`plan_cycle`'s kernel, loaded on first use: compiled ahead of time where
    `scripts/setup` built it, else through numba's JIT (about 0.5 s more to load)."""
    return aot.plan_cycle()


def plan_cycle(needs: Sequence[Need], now: float, total: int, slot: float, *,
               descending: bool = True, all_met: bool = False) -> list[Allotted] | None:
    """`reference.plan_cycle` in one call to the kernel (compiled ahead of time if built)."""
    ok, order, gpus, changes = _cycle_kernel()(
        *need_arrays(needs), *scalars(now, total, slot), bool(descending), bool(all_met))
    if not ok and all_met:
        return None
    return [Allotted(needs[i], g, None if math.isnan(t) else t)
            for i, g, t in zip(order.tolist(), gpus[order].tolist(),
                               changes[order].tolist(), strict=True)]


NeedArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                   np.ndarray]


def need_arrays(needs: Sequence[Need]) -> NeedArrays:
    """The kernel's view of the jobs: work, deadline, and rows by GPU count 0 … 64 of speed,
    the largest level within so many free GPUs, whether a count is a level, and the levels."""
    _ROWS.trim(len(needs))
    rows = np.fromiter((_ROWS.row_of(need.rate) for need in needs), np.int64, len(needs))
    speed, fit, levels, is_level = (table[rows] for table in _ROWS.tables())
    return (np.array([need.left for need in needs], np.float64),
            np.array([need.deadline for need in needs], np.float64),
            speed, fit, levels, np.array([len(need.levels) for need in needs], np.int64), is_level)


class _RowBank:
    """Every distinct speed table's kernel rows, kept in arrays that grow in place, so that a
    cycle gathers its jobs' rows by index (a job keeps one rate dict for life: found by
    identity, and the dict is held so its id is not reused). Generated traces give most jobs
    a table of their own, so the bank starts afresh once it holds far more tables than a
    cycle uses: its memory follows the active jobs, not the trace."""

    _HELD_MAX = 100_000  # rate dicts remembered by identity; a long-lived scheduler forgets
    _TABLES_MIN = 4_096  # the bank is never emptied below this many tables

    def __init__(self) -> None:
        self._by_table: dict[tuple[tuple[int, float], ...], int] = {}
        self._by_object: dict[int, tuple[Mapping[int, float], int]] = {}
        self._size = 0
        self._arrays = _row_arrays(64)

    def trim(self, in_use: int) -> None:
        """Start afresh, between cycles, once the tables outnumber a cycle's jobs fourfold."""
        if self._size > max(self._TABLES_MIN, 4 * in_use):
            self._by_table.clear()
            self._by_object.clear()
            self._size = 0

    def row_of(self, rate: Mapping[int, float]) -> int:
        held = self._by_object.get(id(rate))
        if held is not None and held[0] is rate:
            return held[1]
        table = tuple(rate.items())
        row = self._by_table.get(table)
        if row is None:
            row = self._by_table[table] = self._add(_kernel_rows(table))
        if len(self._by_object) >= self._HELD_MAX:
            self._by_object.clear()
        self._by_object[id(rate)] = (rate, row)
        return row

    def _add(self, rows: tuple[np.ndarray, ...]) -> int:
        if self._size == len(self._arrays[0]):  # doubling: a table costs O(1), amortised
            grown = _row_arrays(2 * self._size)
            for old, new in zip(self._arrays, grown, strict=True):
                new[:self._size] = old
            self._arrays = grown
        for array, row in zip(self._arrays, rows, strict=True):
            array[self._size] = row
        self._size += 1
        return self._size - 1

    def tables(self) -> tuple[np.ndarray, ...]:
        return tuple(array[:self._size] for array in self._arrays)


def _row_arrays(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    width = TABLE_MAX + 1
    return (np.zeros((capacity, width)), np.zeros((capacity, width), np.int64),
            np.zeros((capacity, width), np.int64), np.zeros((capacity, width), np.bool_))


_ROWS = _RowBank()


def _kernel_rows(rate: tuple[tuple[int, float], ...]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One speed table's rows for the kernel (speed, fit, levels, is-level)."""
    need = Need("", 1.0, 0.0, dict(rate))
    width = TABLE_MAX + 1
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


def scalars(now: float, total: int, slot: float) -> tuple[float, int, float]:
    """The kernel's scalar arguments with fixed types: numba compiles once per type
    combination (an int `now` would cost another ~20 s compile)."""
    return float(now), int(total), float(slot)


def _job_plan(met: bool, alloc_t: np.ndarray, alloc_g: np.ndarray, end: float, real_end: float,
              ts: np.ndarray, vs: np.ndarray) -> JobPlan:
    """A kernel plan as a JobPlan (its profile stays arrays until it is read)."""
    return JobPlan(bool(met), dict(zip(alloc_t.tolist(), alloc_g.tolist(), strict=True)),
                   float(end), float(real_end), (ts, vs))
