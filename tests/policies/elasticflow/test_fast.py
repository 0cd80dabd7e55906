"""The fast path (the compiled kernel) gives exactly what the reference planner gives.

Random cycles as the policy meets them: jobs with ElasticFlow-like speed tables (some poor
scalers, some capped, some best-effort), planned in deadline order on an idle cluster, then
the GPUs left free handed out both ways. GPU counts, plans, the final order and the profile
must match to the last bit.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest

from policies.elasticflow import (
    NO_DEADLINE,
    Growing,
    JobPlan,
    Need,
    aot,
    fast,
    kernel,
    planner_for,
    reference,
)

SLOT = 60.0


def random_need(rng: random.Random, i: int, now: float) -> Need:
    top = rng.choice((1, 2, 4, 8, 16, 32, 64))
    levels = [g for g in (1, 2, 4, 8, 16, 32, 64) if g <= top]
    if rng.random() < 0.2:  # a table with holes (a level the model cannot use)
        levels = [g for g in levels if g == 1 or rng.random() < 0.7]
    speed, rate = rng.uniform(0.5, 5.0), {}
    for g in levels:
        rate[g] = speed
        speed *= rng.uniform(1.0, 2.0)  # from no gain to linear
    left = rng.uniform(1.0, 3e5) if rng.random() < 0.9 else rng.uniform(1e-6, 1.0)
    kind = rng.random()
    if kind < 0.15:
        deadline = NO_DEADLINE
    elif kind < 0.25:
        deadline = now - rng.uniform(0, 3600)  # already late
    else:
        deadline = now + rng.uniform(60, 5e4)
    return Need(f"j{i}", left, deadline, rate)


def case(seed: int) -> tuple[list[Need], float, int]:
    rng = random.Random(seed)
    now = rng.choice((0.0, 1234.5, 86400.0 * 7 + 0.25))
    total = rng.choice((4, 8, 16, 64, 128, 256, 512, 1024))
    needs = sorted((random_need(rng, i, now) for i in range(rng.randint(1, 40))),
                   key=lambda n: n.deadline)
    return needs, now, total


def seen(plan: JobPlan) -> tuple[object, ...]:
    """All a plan's users read of it (the kernel hands back its profile merged)."""
    return plan.met, plan.alloc, plan.end, plan.real_end, plan.steps


@pytest.mark.parametrize("descending", [True, False])
@pytest.mark.parametrize("seed", range(150))
def test_compiled_leftover_matches_the_readable_one(seed: int, descending: bool) -> None:
    needs, now, total = case(seed)
    ok, plans, free = reference.plan_all(needs, now, total, SLOT)
    fast_ok, fast_plans, fast_free = fast.plan_all(needs, now, total, SLOT)
    assert (fast_ok, fast_free) == (ok, (list(free[0]), list(free[1])))
    assert {j: seen(p) for j, p in fast_plans.items()} == {j: seen(p) for j, p in plans.items()}
    jobs = [Growing(n, plans[n.job_id], plans[n.job_id].alloc[now]) for n in needs]
    slow, quick = copy.deepcopy(jobs), copy.deepcopy(jobs)
    slow_free = reference.allocate_leftover(slow, free, now, total, SLOT, descending)
    fast_free = fast.allocate_leftover(quick, free, now, total, SLOT, descending)
    assert [j.need.job_id for j in quick] == [j.need.job_id for j in slow]
    for a, b in zip(quick, slow, strict=True):
        assert (a.gpus, a.step, seen(a.plan)) == (b.gpus, b.step, seen(b.plan)), a.need.job_id
    assert fast_free == (list(slow_free[0]), list(slow_free[1]))


@pytest.fixture(scope="session")
def aot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cycle kernel built ahead of time here (a build of an older source planted beside
    it, which the build must sweep away)."""
    build_dir = tmp_path_factory.mktemp("aot")
    (build_dir / "elasticflow_cycle_0000000000000000.so").write_bytes(b"stale")
    aot.build(build_dir)
    return build_dir


@pytest.fixture(params=["jit", "aot"])
def cycle_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                 aot_dir: Path) -> None:
    """`plan_cycle` through numba's JIT, or through the module compiled ahead of time."""
    if request.param == "jit":
        cycle = kernel.plan_cycle
    else:
        cycle = aot.load_built(aot_dir)
        assert cycle is not None
    monkeypatch.setattr(fast, "_cycle_kernel", lambda: cycle)


@pytest.mark.usefixtures("cycle_kernel")
@pytest.mark.parametrize("seed", range(0, 150, 3))
def test_one_compiled_cycle_matches_the_readable_planner(seed: int) -> None:
    """`plan_cycle` in one kernel call: the same order, GPUs and next changes, and the same
    refusal when the admission check (every deadline met) fails."""
    needs, now, total = case(seed)
    for all_met in (False, True):
        slow = reference.plan_cycle(needs, now, total, SLOT, all_met=all_met)
        quick = fast.plan_cycle(needs, now, total, SLOT, all_met=all_met)
        assert quick == slow
    assert fast.plan_cycle(needs, now, total, SLOT) is not None


def test_row_bank_finds_each_table_by_identity_or_content(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The kernel's rows of a speed table are stacked once: the same dict, an equal copy and
    (after the identity memo is emptied) the same dict again all gather the same row."""
    from policies.elasticflow.fast import _kernel_rows, _RowBank

    monkeypatch.setattr(_RowBank, "_HELD_MAX", 2)
    bank = _RowBank()
    a, b, c = {1: 1.0, 2: 1.9}, {1: 1.0, 2: 1.9, 4: 3.5}, {1: 1.0, 2: 1.9}
    rows = [bank.row_of(r) for r in (a, b, a, c, b, a)]  # a third dict empties the memo
    assert rows == [0, 1, 0, 0, 1, 0]
    for rate, row in ((a, 0), (b, 1)):
        for table, want in zip(bank.tables(), _kernel_rows(tuple(rate.items())), strict=True):
            assert (table[row] == want).all()


def test_row_bank_grows_in_place_and_starts_afresh_past_its_tables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its first 64 rows the bank grows without losing one; once it holds more than
    `_TABLES_MIN` and four times a cycle's tables it starts afresh, and every row gathered
    after that is still the table's own."""
    from policies.elasticflow.fast import _kernel_rows, _RowBank

    monkeypatch.setattr(_RowBank, "_TABLES_MIN", 100)
    bank = _RowBank()
    rates = [{1: 1.0, 2: 1.0 + k / 1000} for k in range(150)]
    assert [bank.row_of(r) for r in rates] == list(range(150))
    bank.trim(30)  # 150 tables > max(100, 4 × 30): emptied
    assert bank.tables()[0].shape[0] == 0
    rows = [bank.row_of(r) for r in rates[140:]]
    assert rows == list(range(10))
    bank.trim(10)  # 10 tables: kept
    assert [bank.row_of(r) for r in rates[140:]] == rows
    for rate, row in zip(rates[140:], rows, strict=True):
        for table, want in zip(bank.tables(), _kernel_rows(tuple(rate.items())), strict=True):
            assert (table[row] == want).all()


def test_the_ahead_of_time_build_is_found_only_for_the_current_source(
        aot_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One module, named for the kernel's source: the older build is gone; an edited kernel
    gets another name, so the build made before the edit is not loaded and the JIT runs
    the current code."""
    built = aot.built_path(aot_dir)
    assert [p.name for p in aot_dir.glob("elasticflow_cycle_*")] == [built.name]
    edited = tmp_path / "kernel.py"
    edited.write_bytes((aot.HERE / "kernel.py").read_bytes()
                       + b"\n# edited\n")
    monkeypatch.setattr(aot, "HERE", tmp_path)
    assert aot.built_path(aot_dir) != built
    assert aot.load_built(aot_dir) is None


def test_the_ahead_of_time_kernel_takes_loosely_typed_arguments(aot_dir: Path) -> None:
    """The compiled function trusts its arguments' types, so the loader's wrapper converts
    them: int32 tables and Python scalars give what the exact types give; a table of the
    wrong shape is refused by name instead of read out of bounds."""
    built = aot.load_built(aot_dir)
    assert built is not None
    needs, now, total = next(c for c in map(case, range(100)) if c[1] == 0.0 and len(c[0]) > 9)
    arrays = fast.need_arrays(needs)
    exact = built(*arrays, *fast.scalars(now, total, SLOT), True, False)
    loose = built(*(a.astype(np.int32) if a.dtype == np.int64 else a for a in arrays),
                   int(now), float(total), int(SLOT), 1, 0)
    assert exact[0] == loose[0]
    for x, y in zip(exact[1:], loose[1:], strict=True):
        np.testing.assert_array_equal(x, y)  # NaN (a plan that never changes) equals NaN
    with pytest.raises(ValueError, match="argument 2 has 1 dimensions, not 2"):
        built(arrays[0], arrays[1], arrays[2][0], *arrays[3:], now, total, SLOT, True, False)


def test_plain_python_is_kept_when_numba_is_told_not_to_compile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """NUMBA_DISABLE_JIT=1 (for stepping through the kernel) is honoured: the ahead-of-time
    module is not loaded even where it is built."""
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    assert aot.plan_cycle() is kernel.plan_cycle


def test_a_build_that_cannot_be_loaded_leaves_the_jit_running(tmp_path: Path) -> None:
    """A damaged module under the current source's name is an import error, not a dead
    policy: the JIT kernel is used instead."""
    aot.built_path(tmp_path).write_bytes(b"not an ELF file")
    with pytest.raises(ImportError):
        aot.load_built(tmp_path)
    assert aot.plan_cycle(tmp_path) is kernel.plan_cycle


def test_the_planner_is_chosen_in_one_place() -> None:
    """The fast path for jobs within its 64-GPU tables, the reference planner for any job
    beyond them, and for no jobs at all."""
    small = Need("a", 10.0, NO_DEADLINE, {1: 1.0, 64: 40.0})
    large = Need("b", 10.0, NO_DEADLINE, {1: 1.0, 128: 70.0})
    assert planner_for([small]) is fast
    assert planner_for([small, large]) is reference
    assert planner_for([]) is reference
