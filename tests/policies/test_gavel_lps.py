"""Gavel's allocation LPs on clusters small enough to solve by hand (algorithms.md §3a)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies.allox import AlloX
from policies.fifo_rounds import FifoPerf, FifoRandom
from policies.finish_time_fairness import FinishTimeFairnessPerf, FinishTimeFairnessSolver
from policies.max_min_fairness import MaxMinFairness, MaxMinFairnessPerf, MaxMinLp, max_min_fairness
from policies.mechanisms.allocation import AllocationInput
from policies.min_cost import MinCost, MinCostSlo
from policies.min_makespan import MinMakespan


def inp(rates: list[list[float]], capacity: list[float], *, gpus: list[float] | None = None,
        weights: list[float] | None = None, remaining: list[float] | None = None,
        age: list[float] | None = None, types: tuple[str, ...] | None = None,
        prices: list[float] | None = None, deadlines: list[float] | None = None,
        now: float = 0.0) -> AllocationInput:
    m, n = len(rates), len(capacity)
    return AllocationInput(
        job_ids=tuple(str(i) for i in range(m)),
        types=types or ("k80", "p100", "v100")[:n] if n <= 3 else tuple(f"t{j}" for j in range(n)),
        throughputs=np.array(rates, dtype=float),
        gpus=np.array(gpus or [1.0] * m),
        weights=np.array(weights or [1.0] * m),
        remaining=np.array(remaining or [1000.0] * m),
        age_s=np.array(age or [0.0] * m),
        capacity=np.array(capacity, dtype=float),
        prices=np.array(prices or [1.0] * n),
        deadline_s=np.array(deadlines or [np.inf] * m),
        now=now,
    )


def feasible(a: AllocationInput, x: np.ndarray) -> None:
    assert x.shape == a.shape
    assert (x >= -1e-6).all()
    assert (x.sum(axis=1) <= 1 + 1e-6).all()
    assert ((a.gpus[:, None] * x).sum(axis=0) <= a.capacity + 1e-6).all()


# -- max-min fairness ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("case", "data", "expected"),
    [
        # two equal jobs on one GPU split it evenly
        ("equal", inp([[1.0], [1.0]], [1]), [[0.5], [0.5]]),
        # weight 2 earns twice the time share
        ("weights", inp([[1.0], [1.0]], [1], weights=[2, 1]), [[2 / 3], [1 / 3]]),
        # a 2-GPU job normalised to the even split: the 1-GPU job runs all the time, the
        # gang half the time (2·0.5 + 1 = 2 GPUs)
        ("gangs", inp([[1.0], [1.0]], [2], gpus=[2, 1]), [[0.5], [1.0]]),
    ],
)
def test_max_min_fairness_unique_optima(case: str, data: AllocationInput,
                                        expected: list[list[float]]) -> None:
    x = max_min_fairness(MaxMinLp(), data, data.throughputs)
    feasible(data, x)
    np.testing.assert_allclose(x, expected, atol=1e-4, err_msg=case)


def test_max_min_fairness_perf_reaches_the_hand_optimum_on_two_types() -> None:
    # types (k80, v100), one GPU each; job 0 is 3x faster on the v100, job 1 indifferent.
    # Even split: each job half of each type, so T_even = (2, 1); normalised throughputs
    # (0.5, 1.5) and (1, 1). Job 1 can reach at most 1 (its row sums to 1), so the optimum is
    # 1: job 1 runs all the time, job 0 gets at least its even-split throughput.
    data = inp([[1.0, 3.0], [1.0, 1.0]], [1, 1], types=("k80", "v100"))
    x = max_min_fairness(MaxMinLp(), data, data.throughputs)
    feasible(data, x)
    normalised = (data.throughputs * x).sum(axis=1) / np.array([2.0, 1.0])
    assert normalised.min() == pytest.approx(1.0, abs=1e-4)
    assert x[1].sum() == pytest.approx(1.0, abs=1e-4)


def test_max_min_padding_rows_never_bind() -> None:
    # 17 jobs compile a size-18 problem: the padding row must change nothing.
    data = inp([[1.0]] * 17, [4])
    x = max_min_fairness(MaxMinLp(), data, data.throughputs)
    np.testing.assert_allclose(x[:, 0], np.full(17, 4 / 17), atol=1e-4)


def test_max_min_recompiles_only_for_a_new_size_bucket() -> None:
    solver = MaxMinLp()
    for m in (17, 20, 31, 32):  # all in the power-of-two bucket 32
        max_min_fairness(solver, inp([[1.0]] * m, [8]), np.ones((m, 1)))
    assert solver.cache.stats.compiles == 1
    assert solver.cache.stats.cache_hits == 3


@pytest.mark.parametrize("m", [5, 40, 130])
def test_past_dpp_rows_max_the_lps_reach_the_same_optimum_uncompiled(
        m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above `DPP_ROWS_MAX` rows an LP is solved without cvxpy's compiled (DPP) form, which
    grows with the square of the rows. The optimum is unique even where X is not: on random
    three-type instances both ways give the same max-min level (with and without water
    filling's frozen rows) and the same worst finish-time-fairness rho."""
    import policies.max_min_fairness as mmf
    from policies.mechanisms import lp

    rng = np.random.default_rng(m)
    data = inp(rng.uniform(0.2, 3.0, (m, 3)).tolist(), [8, 8, 16],
               gpus=rng.choice([1.0, 2.0, 4.0], m).tolist(),
               weights=rng.choice([1.0, 2.0], m).tolist(),
               remaining=rng.uniform(100, 5000, m).tolist(), age=rng.uniform(0, 900, m).tolist())
    coeff = mmf.normalised(data, data.throughputs)
    frozen = np.where(np.arange(m) % 3 == 0, 0.05, np.nan)

    def solved() -> tuple[list[float], float]:
        levels = []
        for f in (None, frozen):
            sol = MaxMinLp().solve_levels(coeff, data.gpus, data.capacity, f)
            assert sol is not None
            assert (sol.x >= 0).all() and (sol.x.sum(axis=1) <= 1 + 1e-6).all()
            used = (data.gpus[:, None] * sol.x).sum(axis=0)  # within the solver's tolerance
            assert (used <= data.capacity * (1 + 1e-5)).all()
            levels.append(sol.level)
        ftf = FinishTimeFairnessSolver()
        ftf.solve(data, data.throughputs)
        return levels, max(ftf.rho.values())

    import cvxpy as cp

    asked: list[bool] = []
    solve = cp.Problem.solve

    def recorded(problem: cp.Problem, *args: object, **kwargs: object) -> object:
        asked.append(bool(kwargs.get("ignore_dpp")))
        return solve(problem, *args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(cp.Problem, "solve", recorded)
    compiled = solved()
    assert asked and not any(asked)
    asked.clear()
    monkeypatch.setattr(lp, "DPP_ROWS_MAX", 0)
    plain = solved()
    assert asked and all(asked)
    assert plain[0] == pytest.approx(compiled[0], rel=1e-4)
    assert plain[1] == pytest.approx(compiled[1], rel=1e-4)


# -- finish-time fairness --------------------------------------------------------------------
def test_ftf_equal_fresh_jobs_share_equally() -> None:
    data = inp([[1.0], [1.0]], [1])
    x = FinishTimeFairnessSolver().solve(data, data.throughputs)
    np.testing.assert_allclose(x, [[0.5], [0.5]], atol=1e-4)


def test_ftf_older_job_gets_the_golden_share() -> None:
    # One GPU, isolated share 1/2 each, so iso = 2R for both. Job 0 has waited R seconds:
    # rho_0 = (R + R/x0)/2R, rho_1 = (R/x1)/2R; equal rho and x0 + x1 = 1 give
    # x0^2 + x0 - 1 = 0, x0 = (sqrt 5 - 1)/2.
    r = 1000.0
    data = inp([[1.0], [1.0]], [1], remaining=[r, r], age=[r, 0.0])
    solver = FinishTimeFairnessSolver()
    x = solver.solve(data, data.throughputs)
    golden = (math.sqrt(5) - 1) / 2
    np.testing.assert_allclose(x[:, 0], [golden, 1 - golden], atol=1e-4)
    assert solver.rho["0"] == pytest.approx(solver.rho["1"], rel=1e-4)


def test_ftf_accumulates_isolated_time_between_allocations() -> None:
    solver = FinishTimeFairnessSolver()
    solver.solve(inp([[2.0], [2.0]], [1], remaining=[1000, 1000]), np.full((2, 1), 2.0))
    # isolated rate: half the GPU at 2 it/s = 1 it/s; 300 iterations later → 300 s credited
    solver.solve(inp([[2.0], [2.0]], [1], remaining=[700, 1000]), np.full((2, 1), 2.0))
    assert solver.history["0"].iso_s == pytest.approx(300.0)
    assert solver.history["1"].iso_s == pytest.approx(0.0)


# -- the registered policies' allocation step --------------------------------------------------
def test_agnostic_variants_ignore_the_type_profile() -> None:
    data = inp([[1.0, 10.0], [2.0, 2.0]], [1, 1], types=("k80", "v100"))
    np.testing.assert_allclose(MaxMinFairness().allocate(data),
                               max_min_fairness(MaxMinLp(), data, np.ones(data.shape)))
    perf = FinishTimeFairnessPerf()
    assert perf.allocate(data).shape == (2, 2)


def test_fifo_perf_takes_the_fastest_free_type_then_blocks() -> None:
    # one k80, one v100; job 0 prefers the v100, job 1 gets the k80, job 2 waits (no type
    # left) and job 3 may not overtake it.
    data = inp([[1.0, 3.0], [1.0, 2.0], [1.0, 1.0], [1.0, 1.0]], [1, 1], types=("k80", "v100"))
    x = FifoPerf().allocate(data)
    np.testing.assert_array_equal(x, [[0, 1], [1, 0], [0, 0], [0, 0]])


def test_fifo_random_keeps_each_job_on_its_type() -> None:
    fifo = FifoRandom()
    fifo.configure(seed=3, round_s=360.0)
    data = inp([[1.0, 3.0], [1.0, 2.0]], [2, 2], types=("k80", "v100"))
    first = fifo.allocate(data)
    again = fifo.allocate(data)
    np.testing.assert_array_equal(first, again)
    assert (first.sum(axis=1) == 1).all()


def test_max_min_fairness_perf_registered_with_rounds() -> None:
    p = MaxMinFairnessPerf()
    assert p.replan == "round" and p.aware
    assert not MaxMinFairness().aware


# -- min makespan, cost, AlloX ------------------------------------------------------------------
def test_min_makespan_balances_finish_times() -> None:
    # One GPU; jobs of 300 and 100 iterations at 1 it/s: both done at 400 s at best, which
    # needs shares proportional to the work: 3/4 and 1/4.
    data = inp([[1.0], [1.0]], [1], remaining=[300, 100])
    x = MinMakespan().allocate(data)
    np.testing.assert_allclose(x[:, 0], [0.75, 0.25], atol=1e-4)


def test_min_makespan_uses_the_fast_type_for_the_long_job() -> None:
    # k80 and v100, one GPU each; job 0 (long) is 4x faster on v100, job 1 (short) equal:
    # the optimum gives job 0 the v100 the whole time.
    data = inp([[1.0, 4.0], [1.0, 1.0]], [1, 1], remaining=[4000, 900], types=("k80", "v100"))
    x = MinMakespan().allocate(data)
    feasible(data, x)
    finish = data.remaining / (data.throughputs * x).sum(axis=1)
    assert finish.max() == pytest.approx(1000.0, rel=1e-3)  # job 0: 4000 it at 4 it/s


def test_min_cost_prefers_throughput_per_dollar() -> None:
    # k80 at $1 gives 1 it/s, v100 at $4 gives 2 it/s: per dollar the k80 wins, so with one
    # job it runs on the k80 only.
    data = inp([[1.0, 2.0]], [1, 1], types=("k80", "v100"), prices=[1.0, 4.0])
    x = MinCost().allocate(data)
    np.testing.assert_allclose(x, [[1.0, 0.0]], atol=1e-6)


def test_min_cost_slo_buys_the_speed_a_deadline_needs() -> None:
    # The same job must do 1500 iterations in 1000 s: 1.5 it/s, only possible with v100
    # time: x_k80 + 2 x_v100 ≥ 1.5 with x_k80 + x_v100 ≤ 1 → cheapest x_v100 = 0.5.
    data = inp([[1.0, 2.0]], [1, 1], types=("k80", "v100"), prices=[1.0, 4.0],
               remaining=[1500], deadlines=[1000.0])
    x = MinCostSlo().allocate(data)
    np.testing.assert_allclose(x, [[0.5, 0.5]], atol=1e-5)


def test_min_cost_slo_drops_unmeetable_slos() -> None:
    data = inp([[1.0, 2.0]], [1, 1], types=("k80", "v100"), prices=[1.0, 4.0],
               remaining=[10_000], deadlines=[100.0])
    policy = MinCostSlo()
    x = policy.allocate(data)
    assert policy.slo_dropped == 1
    np.testing.assert_allclose(x, [[1.0, 0.0]], atol=1e-6)


def test_allox_runs_the_shortest_job_first() -> None:
    # One GPU, three jobs: shortest processing time first minimises the total completion time.
    data = inp([[1.0], [1.0], [1.0]], [1], remaining=[4000, 1000, 3000])
    x = AlloX().allocate(data)
    np.testing.assert_array_equal(x[:, 0], [0, 1, 0])


def test_allox_sends_each_job_where_it_gains() -> None:
    # Job 0 is 10x faster on the v100, job 1 barely cares: job 0 gets the v100.
    data = inp([[1.0, 10.0], [1.0, 1.1]], [1, 1], types=("k80", "v100"),
               remaining=[1000, 1000])
    x = AlloX().allocate(data)
    np.testing.assert_array_equal(x, [[0, 1], [1, 0]])


def test_allox_rejects_multi_gpu_jobs_at_admission() -> None:
    from tests.builders import make_job

    assert AlloX().admit(make_job("a").gpus(2).build()) is not None
    assert AlloX().admit(make_job("b").build()) is None


def test_water_filling_raises_jobs_above_the_bottleneck() -> None:
    # k80 and v100, one GPU each. Job 0 runs on the v100 only; job 1 anywhere at the same
    # speed. Job 1 is capped at normalised throughput 1 (its time share cannot exceed 1), so
    # plain max-min stops at level 1 and job 0 may get as little as half the v100; water
    # filling freezes job 1 and then gives job 0 the whole v100 (level 2).
    from policies.max_min_fairness import water_filling

    data = inp([[0.0, 1.0], [1.0, 1.0]], [1, 1], types=("k80", "v100"))
    plain = max_min_fairness(MaxMinLp(), data, data.throughputs)
    assert plain[0, 1] >= 0.5 - 1e-6
    x = water_filling(MaxMinLp(), data, data.throughputs)
    feasible(data, x)
    assert x[0, 1] == pytest.approx(1.0, abs=1e-4)
    assert x[1].sum() == pytest.approx(1.0, abs=1e-4)
