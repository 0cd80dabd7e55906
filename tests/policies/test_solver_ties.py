"""Solver output within tolerance must not reach decisions (docs/replay.md, "Solvers and
determinism"): a solution nudged by 1e-9, or symmetric jobs' values swapped, decides the same."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import policies.max_min_fairness as mmf
import policies.mechanisms.lp as lp
from policies.allox import AlloX, canonical_ties
from policies.themis import FairnessLp
from schemas.cluster import ClusterSpec
from tests.builders import make_job, simulate
from tests.policies.test_gavel_lps import inp
from tests.policies.test_themis import J, themis_driver

NUDGE = 1e-9  # about a tenth of the solvers' tolerance: what another version may return


def test_snap_makes_values_within_tolerance_equal_and_noise_zero() -> None:
    x = np.array([1 / 3, 1 / 3 + NUDGE, 1 / 3 - NUDGE, 1.5e-10, -3e-11, 0.25])
    out = lp.snap(x)
    assert out[0] == out[1] == out[2]
    assert out[3] == 0.0 and out[4] == 0.0 and not np.signbit(out[4])  # not -0.0
    assert out[5] == 0.25


class _Nudged:
    """A cvxpy problem whose solution comes back with one job's row raised by NUDGE, as
    another solver version might return the same optimum."""

    def __init__(self, problem: Any, x: Any, row: int) -> None:
        self.problem, self.x, self.row = problem, x, row

    @property
    def status(self) -> str:
        return str(self.problem.status)

    def solve(self, **kwargs: Any) -> None:
        self.problem.solve(**kwargs)
        value = np.array(self.x.value)
        if self.row < len(value):  # later allocations have fewer jobs
            value[self.row] += NUDGE
            self.x.value = value


def _gavel_digest(monkeypatch: pytest.MonkeyPatch, row: int | None) -> str:
    """Three identical jobs on one GPU under max-min fairness: the LP gives each 1/3."""
    real = lp.solve_first

    def nudged(problem: Any, variable: Any, solvers: Any, **kw: Any) -> Any:
        if row is None:
            return real(problem, variable, solvers, **kw)
        return real(_Nudged(problem, variable, row), variable, solvers,  # type: ignore[arg-type]
                    **kw)

    monkeypatch.setattr(mmf, "solve_first", nudged)
    jobs = [make_job(f"j{i}").rates(v100=1.0).iterations(900).build() for i in range(3)]
    cl = ClusterSpec.heterogeneous({"v100": 1}, 1)
    result = simulate(jobs, "max-min-fairness-perf", cl, round_s=300.0)
    assert result.summary["finished"] == 3
    return str(result.summary["decision_digest"])


def test_gavel_lp_nudged_within_tolerance_decides_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _gavel_digest(monkeypatch, None)
    assert [_gavel_digest(monkeypatch, row) for row in (0, 1, 2)] == [plain] * 3


def test_without_the_snap_the_nudge_would_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test above is not vacuous: unsnapped, the nudged job runs first.
    monkeypatch.setattr(lp, "snap", lambda x, decimals=lp.SHARE_DECIMALS: x)
    assert len({_gavel_digest(monkeypatch, row) for row in (0, 2)}) == 2


class _Shares(FairnessLp):
    """Returns fixed shares (by job order: submit time, then id) instead of solving."""

    def __init__(self, shares: list[float]) -> None:
        super().__init__()
        self.shares = shares

    def solve(self, a: np.ndarray, b: np.ndarray, gpus: np.ndarray,
              capacity: float) -> np.ndarray | None:
        return np.array(self.shares[: len(a)], dtype=np.float64)


@pytest.mark.parametrize("shares", [[0.5, 0.5 + 1e-11, 0.5], [0.5 + 1e-11, 0.5, 0.5 - 1e-11],
                                    [0.5, 0.5, 0.5 + 1e-11]])
def test_themis_shares_differing_below_its_rounding_rank_by_id(shares: list[float]) -> None:
    # Three identical 4-GPU jobs on one 4-GPU node: equal shares, so the id decides (a runs).
    d, policy = themis_driver()
    policy.lp = _Shares(shares)
    d.add(J("a"), J("b"), J("c"))
    assert set(d.cycle(0).run) == {"a"}
    assert policy.order == ["a", "b", "c"]


Matcher = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _reversed_ties(real: Matcher) -> Matcher:
    """scipy's matching with the slots of equal cost rows handed out in reverse: another
    optimum, as another implementation might return."""
    def match(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, cols = real(cost)
        cols = cols.copy()
        groups: dict[bytes, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(cost[r].tobytes(), []).append(i)
        for members in groups.values():
            cols[members] = cols[members][::-1]
        return rows, cols
    return match


@pytest.mark.parametrize(("rates", "capacity"), [
    ([[1.0]] * 3, [1]),
    ([[1.0]] * 5, [2]),
    ([[1.0, 2.0]] * 4, [1, 1]),
])
def test_allox_equal_jobs_matched_either_way_decide_the_same(
        monkeypatch: pytest.MonkeyPatch, rates: list[list[float]], capacity: list[float]) -> None:
    import scipy.optimize

    types = ("k80", "v100")[: len(capacity)]
    data = inp(rates, capacity, types=types)
    plain = AlloX().allocate(data)
    monkeypatch.setattr(scipy.optimize, "linear_sum_assignment",
                        _reversed_ties(scipy.optimize.linear_sum_assignment))
    np.testing.assert_array_equal(AlloX().allocate(data), plain)
    # The earlier (here: first admitted) of equal jobs runs first.
    running = plain.sum(axis=1)
    assert list(running) == sorted(running, reverse=True)


def test_canonical_ties_leaves_distinct_jobs_alone() -> None:
    cost = np.array([[1.0, 2.0], [3.0, 1.0]])
    rows, cols = np.array([0, 1]), np.array([0, 1])
    np.testing.assert_array_equal(canonical_ties(cost, rows, cols, 2), cols)
