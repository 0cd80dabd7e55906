"""Themis (policies/themis.py): the finish-time-fairness LP, its cache, the ranking, end to end.

Notation (module docstring, algorithms.md §9): rho_m = a_m + b_m / x_m with, for the policy,
share_m = min(1, ceil(G / M) / gpus_m), iso_m = t_iso_m + remaining_m / share_m (Muri's units),
a_m = (now − submit_m) / iso_m, b_m = remaining_m × iteration_time_m / iso_m.
All jobs here run one iteration per second unless said otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

import policies
from policies.base import Plan
from policies.mechanisms.lp import bucket
from policies.themis import NEVER_RAN, FairnessLp, Themis, binding_shares, rank_key
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from schemas.status import StatusCode
from tests.builders import cluster, make_job, simulate
from tests.policies.driver import Driver

GOLDEN = (math.sqrt(5) - 1) / 2  # 0.618…: solves 1 + 1/x = 1/(1 − x)


def J(job_id: str, gpus: int = 4, seconds: float = 100, submit: float = 0.0,
      iteration_s: float = 1.0) -> JobSpec:
    b = make_job(job_id).gpus(gpus).submit(submit)
    return b.iterations(int(seconds / iteration_s)).iteration_time(iteration_s).build()


def arr(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float64)


def themis_driver(cl: ClusterSpec | None = None, *, muri_units: bool = True,
                  solvers: Sequence[str] = ("CLARABEL", "SCS")) -> tuple[Driver, Themis]:
    policy = Themis(muri_units=muri_units, solvers=solvers)
    return Driver(policy, cl or cluster(1, 4)), policy


def x_of(policy: Themis, job_id: str) -> float:
    ledger = policy.ledger(job_id)
    assert ledger is not None and ledger.x is not None
    return ledger.x


# --------------------------------------------------------------------------------------------
# the LP on its own: min max_m (a_m + b_m / x_m), 0 ≤ x ≤ 1, gpus · x ≤ capacity
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LpCase:
    a: tuple[float, ...]
    b: tuple[float, ...]
    gpus: tuple[float, ...]
    capacity: float
    x: tuple[float, ...]  # expected shares
    rho: float  # expected optimum


LP_CASES = {
    # Equal jobs split the capacity equally: rho = 1 / 0.5.
    "two-identical-equal-shares": LpCase((0, 0), (1, 1), (1, 1), 1, (0.5, 0.5), 2.0),
    # a = 0: rho_m = b_m / x_m equal at the optimum, so x ∝ b: 1/4, 3/4, rho = 4.
    "shares-proportional-to-b": LpCase((0, 0), (1, 3), (1, 1), 1, (0.25, 0.75), 4.0),
    # 1 + 1/x = 1/(1 − x)  ⇔  x² + x − 1 = 0: x = 0.618, rho = 1 + 1/0.618 = 2.618.
    "elapsed-term-golden-ratio": LpCase((1, 0), (1, 1), (1, 1), 1, (GOLDEN, 1 - GOLDEN),
                                        1 + 1 / GOLDEN),
    # Gang sizes weigh in the capacity: 1/x1 = 1/x2 = 1/x with 2x + x = 2 → x = 2/3.
    "gpus-weigh-capacity": LpCase((0, 0), (1, 1), (2, 1), 2, (2 / 3, 2 / 3), 1.5),
    # Four jobs, x ∝ b = 1, 1, 2, 4 over a capacity of 1: rho = 8.
    "four-jobs": LpCase((0, 0, 0, 0), (1, 1, 2, 4), (1, 1, 1, 1), 1,
                        (0.125, 0.125, 0.25, 0.5), 8.0),
    # Three 4-GPU jobs on 4 GPUs: 1/3 each, rho = 0.5 / (1/3).
    "three-gangs": LpCase((0, 0, 0), (0.5, 0.5, 0.5), (4, 4, 4), 4, (1 / 3, 1 / 3, 1 / 3), 1.5),
    # Seventeen jobs use bucket 18 (one padding slot): it must take no capacity.
    "seventeen-padded": LpCase((0,) * 17, (1,) * 17, (1,) * 17, 1, (1 / 17,) * 17, 17.0),
}


@pytest.mark.parametrize("case", LP_CASES.values(), ids=LP_CASES.keys())
def test_lp_optimum_by_hand(case: LpCase) -> None:
    lp = FairnessLp()
    x = lp.solve(arr(*case.a), arr(*case.b), arr(*case.gpus), case.capacity)
    assert x is not None
    assert x == pytest.approx(case.x, abs=1e-4)
    rho = arr(*case.a) + arr(*case.b) / x
    assert rho.max() == pytest.approx(case.rho, rel=1e-4)
    assert float(arr(*case.gpus) @ x) <= case.capacity * (1 + 1e-6)
    assert np.all((x >= 0) & (x <= 1))


def test_lp_capacity_not_binding_gives_the_bottleneck_its_whole_time() -> None:
    # 2 GPUs of capacity 4: both could get x = 1. The optimum is rho = a + b of job 2 = 2,
    # reached only with x2 = 1; job 1 needs only 1/x1 ≤ 2, i.e. x1 ≥ 0.5.
    x = FairnessLp().solve(arr(0, 0), arr(1, 2), arr(1, 1), 4)
    assert x is not None
    assert x[1] == pytest.approx(1.0, abs=1e-4)
    assert 0.5 - 1e-4 <= x[0] <= 1.0


def optimum_by_bisection(a: np.ndarray, b: np.ndarray, gpus: np.ndarray, cap: float) -> float:
    """The min-max rho without an LP: rho_m ≤ t needs x_m ≥ b_m / (t − a_m), x_m ≤ 1, so t*
    is the smallest t ≥ max(a + b) with sum_m gpus_m · b_m / (t − a_m) ≤ cap."""
    def need(t: float) -> float:
        return float(gpus @ np.minimum(1.0, b / (t - a)))
    lo = float((a + b).max())
    if need(lo) <= cap:
        return lo
    hi = lo * 2
    while need(hi) > cap:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if need(mid) <= cap else (mid, hi)
    return hi


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [3, 40])
def test_lp_optimum_matches_bisection(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(0, 3, n), rng.uniform(0.05, 1, n)
    gpus = rng.choice([1.0, 2.0, 4.0, 8.0], n)
    cap = float(rng.choice([8.0, 32.0, 64.0]))
    x = FairnessLp().solve(a, b, gpus, cap)
    assert x is not None
    assert float(gpus @ x) <= cap * (1 + 1e-6)
    assert float((a + b / x).max()) == pytest.approx(optimum_by_bisection(a, b, gpus, cap),
                                                      rel=1e-4)


@pytest.mark.parametrize(
    ("a", "b", "gpus", "capacity"),
    [
        pytest.param(arr(0, 0), arr(1, 1), arr(1, 1), 0.0, id="no-capacity"),
        pytest.param(arr(0, 0), arr(1, 0), arr(1, 1), 1.0, id="no-remaining-work"),
        pytest.param(arr(math.nan, 0), arr(1, 1), arr(1, 1), 1.0, id="nan-elapsed"),
        pytest.param(arr(math.inf, 0), arr(1, 1), arr(1, 1), 1.0, id="zero-isolated-time"),
        pytest.param(arr(), arr(), arr(), 1.0, id="no-jobs"),
    ],
)
def test_lp_degenerate_inputs_give_no_shares(a: np.ndarray, b: np.ndarray, gpus: np.ndarray,
                                             capacity: float) -> None:
    lp = FairnessLp()
    assert lp.solve(a, b, gpus, capacity) is None
    assert lp.stats.fallbacks == 1


# Capacity 4 does not bind: job 2 is the bottleneck at x = 1 (rho = 2), job 1 needs x ≥ 0.5.
SLACK = (arr(0, 0), arr(1, 2), arr(1, 1), 4.0)


def slack_ok(x: np.ndarray | None, tol: float) -> bool:
    return x is not None and abs(x[1] - 1) <= tol and 0.5 - tol <= x[0] <= 1 + tol


def test_lp_every_solver_failing_gives_no_shares() -> None:
    # With capacity > 0 the LP is always feasible (small enough shares fit), and capacity 0
    # is caught before solving (above); failing solvers on a non-binding LP leave nothing.
    lp = FairnessLp(solvers=("NO_SUCH_SOLVER",))
    assert lp.solve(*SLACK) is None
    assert lp.stats.fallbacks == 1 and lp.stats.compiles == 1 and lp.stats.exact == 0


def test_lp_falls_back_to_the_next_solver() -> None:
    lp = FairnessLp(solvers=("NO_SUCH_SOLVER", "SCS"))
    assert slack_ok(lp.solve(*SLACK), 2e-3)  # SCS is first-order: looser
    assert (lp.stats.exact, lp.stats.rescaled, lp.stats.secondary, lp.stats.fallbacks) == (
        0, 0, 1, 0)


def test_lp_scaled_retry_gives_the_same_optimum() -> None:
    # The first solver fails on the raw and the scaled data; Clarabel then solves the scaled
    # problem (max(a + b) = 1): the shares are those of the raw problem (100 × SLACK).
    lp = FairnessLp(solvers=("NO_SUCH_SOLVER", "CLARABEL"))
    a, b, gpus, cap = SLACK
    assert slack_ok(lp.solve(100 * a, 100 * b, gpus, cap), 1e-4)
    assert (lp.stats.rescaled, lp.stats.secondary) == (0, 1)


BINDING = [c for c in LP_CASES.values() if c.capacity < sum(c.gpus)]


@pytest.mark.parametrize("case", BINDING)
def test_binding_shares_closed_form(case: LpCase) -> None:
    x = binding_shares(arr(*case.a), arr(*case.b), arr(*case.gpus), case.capacity)
    assert x is not None and x == pytest.approx(case.x, abs=1e-9)


def test_binding_shares_leaves_a_non_binding_lp_to_the_solver() -> None:
    assert binding_shares(*SLACK) is None


def test_failed_solve_of_a_binding_lp_uses_the_closed_form() -> None:
    lp = FairnessLp(solvers=("NO_SUCH_SOLVER",))
    case = LP_CASES["elapsed-term-golden-ratio"]
    x = lp.solve(arr(*case.a), arr(*case.b), arr(*case.gpus), case.capacity)
    assert x is not None and x == pytest.approx(case.x, abs=1e-9)
    assert (lp.stats.exact, lp.stats.fallbacks) == (1, 0)


@pytest.mark.parametrize("seed", range(4))
def test_lp_matches_the_closed_form_when_binding(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b, gpus = rng.uniform(0, 1, 30), rng.uniform(0.05, 1, 30), rng.choice([1.0, 4.0], 30)
    exact = binding_shares(a, b, gpus, 8.0)
    assert exact is not None
    x = FairnessLp().solve(a, b, gpus, 8.0)
    assert x == pytest.approx(exact, abs=1e-5)


def test_lp_data_spanning_many_orders_of_magnitude() -> None:
    # One job's elapsed term dwarfs the rest (a job far past its isolated finish time): the
    # raw data span 1e14, which may need the scaled retry; either way the optimum is right.
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0, 1e-3, 40), rng.uniform(1e-4, 1e-2, 40)
    a[0] = 1e11
    gpus = rng.choice([1.0, 2.0, 4.0, 8.0], 40)
    lp = FairnessLp()
    x = lp.solve(a, b, gpus, 64.0)
    assert x is not None and lp.stats.fallbacks == 0
    assert float(gpus @ x) <= 64.0 * (1 + 1e-6)
    assert float((a + b / x).max()) == pytest.approx(optimum_by_bisection(a, b, gpus, 64.0),
                                                      rel=1e-6)


# --------------------------------------------------------------------------------------------
# compile once per size, then re-solve
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("n", "size"),
    [(1, 1), (2, 2), (16, 16), (17, 18), (18, 18), (32, 32), (33, 36), (100, 104), (129, 144),
     (1000, 1024)],
)
def test_bucket_sizes(n: int, size: int) -> None:
    assert bucket(n) == size
    assert n <= size <= n * 1.125


def test_resolve_reuses_the_compiled_dpp_problem() -> None:
    lp = FairnessLp()
    first = lp.solve(arr(0, 0, 0), arr(1, 1, 2), arr(1, 1, 1), 1)
    compiled = lp.compiled(3)  # a cache hit itself
    assert compiled.problem.is_dpp()
    again = lp.solve(arr(1, 0, 0), arr(1, 1, 1), arr(1, 1, 1), 1)  # new values, same problem
    assert lp.stats.compiles == 1 and lp.stats.cache_hits == 2 and lp.stats.solves == 2
    assert lp.compiled(3) is compiled
    assert first is not None and again is not None
    assert first == pytest.approx([0.25, 0.25, 0.5], abs=1e-4)
    assert again[0] > again[1] == pytest.approx(again[2], abs=1e-6)  # the parameters moved it


def test_resolve_does_not_depend_on_earlier_solves() -> None:
    rng = np.random.default_rng(7)
    first = (rng.uniform(0, 1, 24), rng.uniform(0.05, 1, 24), rng.choice([1.0, 8.0], 24), 64.0)
    other = (rng.uniform(0, 5, 24), rng.uniform(0.01, 2, 24), rng.choice([2.0, 4.0], 24), 16.0)
    lp = FairnessLp()
    x1 = lp.solve(*first)
    lp.solve(*other)
    x2 = lp.solve(*first)
    assert x1 is not None and x2 is not None
    assert x1.tobytes() == x2.tobytes()  # bit for bit: same inputs, same plan
    assert lp.stats.compiles == 1


def test_sizes_in_one_bucket_share_a_problem() -> None:
    lp = FairnessLp()
    for n in (17, 18, 17):
        x = lp.solve(np.zeros(n), np.ones(n), np.ones(n), 1)
        assert x is not None and x == pytest.approx([1 / n] * n, abs=1e-4)
    assert lp.stats.compiles == 1 and lp.stats.cache_hits == 2


def test_policy_compiles_once_per_job_count() -> None:
    d, policy = themis_driver(cluster(1, 8))
    d.add(J("a", 4, 1000), J("b", 4, 1000), J("c", 4, 1000))
    for t in (0, 10, 20, 30):
        d.cycle(t)
    assert policy.lp.stats.compiles == 1 and policy.lp.stats.cache_hits == 3
    d.add(J("d", 4, 1000, 40))
    d.cycle(40)
    assert policy.lp.stats.compiles == 2


# --------------------------------------------------------------------------------------------
# the policy's LP inputs: isolated share, isolated time, Muri's units
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShareCase:
    jobs: tuple[JobSpec, ...]
    first_cycle: float
    x: dict[str, float]
    rho: float
    muri_units: bool = True


SHARE_CASES = {
    # G = 4, M = 3: share = min(1, ceil(4/3)/4) = 0.5; at t=0, a = 0 and b = rem × 1 / (rem /
    # 0.5) = 0.5 whatever the work: 1/3 each, rho = 0.5 × 3 = 1.5.
    "at-submit-work-does-not-matter": ShareCase(
        (J("a", 4, 100), J("b", 4, 100), J("c", 4, 10)), 0.0,
        {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 1.5),
    # First cycle at t=100, both submitted at 0, never ran; share 0.5, iso = 200 and 600:
    # a = 0.5, 1/6; b = 0.5. 0.5 + 0.5/x = 1/6 + 0.5/(1 − x) ⇔ x² + 2x − 1.5 = 0:
    # x = √2.5 − 1 = 0.581 for the job with less work left (it has waited longer relatively).
    "less-work-left-more-share-after-waiting": ShareCase(
        (J("short", 4, 100), J("long", 4, 300)), 100.0,
        {"short": math.sqrt(2.5) - 1, "long": 2 - math.sqrt(2.5)},
        0.5 + 0.5 / (math.sqrt(2.5) - 1)),
    # Muri's units slip: iso counts iterations / share, so b = iteration time × share:
    # 0.5 and 1.0 → x ∝ b = 1/3, 2/3 (rho = 1.5) although both need 100 s alone.
    "muri-units-favour-slow-iterations": ShareCase(
        (J("fast", 4, 100, iteration_s=1.0), J("slow", 4, 100, iteration_s=2.0)), 0.0,
        {"fast": 1 / 3, "slow": 2 / 3}, 1.5),
    # With seconds as units, b = share = 0.5 for both: equal shares, rho = 1.
    "seconds-units-treat-them-alike": ShareCase(
        (J("fast", 4, 100, iteration_s=1.0), J("slow", 4, 100, iteration_s=2.0)), 0.0,
        {"fast": 0.5, "slow": 0.5}, 1.0, muri_units=False),
    # Isolated share capped at 1: 1-GPU jobs with ceil(8/2) = 4 GPUs each have share 1;
    # capacity 8 does not bind, the bottleneck (either) gets x = 1: rho = b = 1.
    "isolated-share-capped-at-one": ShareCase(
        (J("a", 1, 100), J("b", 1, 100)), 0.0, {"a": 1.0, "b": 1.0}, 1.0),
}


@pytest.mark.parametrize("case", SHARE_CASES.values(), ids=SHARE_CASES.keys())
def test_policy_shares_by_hand(case: ShareCase) -> None:
    cl = cluster(1, 8) if case.jobs[0].gpus == 1 else cluster(1, 4)
    d, policy = themis_driver(cl, muri_units=case.muri_units)
    d.add(*case.jobs)
    d.cycle(case.first_cycle)
    assert policy.solved
    for jid, x in case.x.items():
        assert x_of(policy, jid) == pytest.approx(x, abs=1e-4), jid
    rhos = [policy.fairness(j.job_id) for j in case.jobs]
    assert max(r for r in rhos if r is not None) == pytest.approx(case.rho, rel=1e-4)


def test_progress_adds_isolated_time_and_lowers_the_share() -> None:
    # t=0: a alone, share min(1, 4/4) = 1, x = 1, a runs. t=10: b arrives; a made 10
    # iterations at share 1 → t_iso = 10. Now M=2, share 0.5: iso_a = 10 + 90/0.5 = 190,
    # iso_b = 100/0.5 = 200. a: 10/190 + 90/190/x; b: 0 + 100/200/(1 − x).
    d, policy = themis_driver()
    d.add(J("a", 4, 100))
    d.cycle(0)
    assert x_of(policy, "a") == pytest.approx(1.0, abs=1e-6)
    d.advance(10)
    d.add(J("b", 4, 100, 10))
    d.cycle()
    ledger = policy.ledger("a")
    assert ledger is not None and ledger.iso == pytest.approx(10.0)
    # 1/19 + 9/19/x = 1/2/(1 − x) ⇔ 2x(1 − x) + 18(1 − x) = 19x ⇔ 2x² + 35x − 18 = 0.
    xa = (-35 + math.sqrt(35**2 + 4 * 2 * 18)) / 4
    assert x_of(policy, "a") == pytest.approx(xa, abs=1e-4)  # 0.4935 < 0.5
    assert x_of(policy, "b") == pytest.approx(1 - xa, abs=1e-4)
    # Next cycle (t=20; b ran 10 s at share 0.5, a waited): t_iso_b = 10 / 0.5 = 20.
    d.cycle(20)
    ledger_b = policy.ledger("b")
    assert ledger_b is not None and ledger_b.iso == pytest.approx(20.0)
    assert policy.ledger("a").iso == pytest.approx(10.0)  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# ranking: (x / attained, or x × 1e9 if never ran; deficit; x) descending; submit; id
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("rows", "order"),
    [
        # (name, x, attained, deficit, submit)
        pytest.param([("ran", 0.9, 1.0, 0, 0), ("new", 0.1, 0.0, 0, 0)], ["new", "ran"],
                     id="never-ran-first-even-with-less-share"),
        pytest.param([("lo", 0.2, 0.0, 0, 0), ("hi", 0.3, 0.0, 0, 0)], ["hi", "lo"],
                     id="never-ran-by-share"),
        # 0.5/100 = 0.005 < 0.2/10 = 0.02
        pytest.param([("a", 0.5, 100.0, 0, 0), ("b", 0.2, 10.0, 0, 0)], ["b", "a"],
                     id="share-per-attained-second"),
        # equal priority 0.005: larger deficit first
        pytest.param([("a", 0.5, 100.0, -100, 0), ("b", 0.25, 50.0, -50, 0)], ["b", "a"],
                     id="ties-by-deficit"),
        # equal priority 0.005 and deficit: larger share first
        pytest.param([("a", 0.25, 50.0, 7, 0), ("b", 0.5, 100.0, 7, 0)], ["b", "a"],
                     id="then-by-share"),
        pytest.param([("b", 0.5, 0.0, 0, 1), ("a", 0.5, 0.0, 0, 2)], ["b", "a"],
                     id="then-by-submit"),
    ],
)
def test_rank_key(rows: list[tuple[str, float, float, float, float]], order: list[str]) -> None:
    keyed = sorted((rank_key(x, att, deficit, submit), name)
                   for name, x, att, deficit, submit in rows)
    assert [name for _, name in keyed] == order


def test_never_ran_priority_is_scaled_share() -> None:
    assert rank_key(0.25, 0.0, 0.0, 0.0)[0] == -0.25 * NEVER_RAN
    assert rank_key(0.25, 5.0, 0.0, 0.0)[0] == -0.05


class FixedShares(FairnessLp):
    """Returns the given shares (by job order: submit time, then id) instead of solving."""

    def __init__(self, shares: Sequence[float]) -> None:
        super().__init__()
        self.shares = list(shares)

    def solve(self, a: np.ndarray, b: np.ndarray, gpus: np.ndarray,
              capacity: float) -> np.ndarray | None:
        return np.array(self.shares[: len(a)], dtype=np.float64)


def test_deficit_and_time_should_have_received_bookkeeping() -> None:
    # x fixed at 0.5. Cycles at 0, 10, 30: should += 0.5 × (now − previous cycle) after the
    # deficit (should − attained) is taken. The previous-cycle clock starts at 0 (Muri).
    d, policy = themis_driver(cluster(1, 8))
    policy.lp = FixedShares([0.5, 0.5])
    d.add(J("a", 8, 1000))
    d.cycle(0)
    d.cycle(10)  # a ran 0–10
    la = policy.ledger("a")
    assert la is not None and (la.deficit, la.should) == (0 - 10, 5.0)
    d.advance(30)
    d.add(J("b", 8, 1000, 30))  # arrives at 30: credited for 10–30 too (Muri's slip)
    d.cycle()
    la, lb = policy.ledger("a"), policy.ledger("b")
    assert la is not None and (la.deficit, la.should) == (5 - 30, 15.0)
    assert lb is not None and (lb.deficit, lb.should) == (0.0, 10.0)


def test_new_job_outranks_running_ones_and_runs() -> None:
    # One node of 4 GPUs, three identical 4-GPU jobs: equal shares, equal keys → by id: a runs.
    # At t=10 a has attained time (priority x/10) while b, c never ran (x × 1e9): b runs
    # (b and c tie on every key but the id); a is last.
    d, _ = themis_driver()
    d.add(J("a"), J("b"), J("c"))
    assert set(d.cycle(0).run) == {"a"}
    assert d.waiting_order() == ["b", "c"]
    plan = d.cycle(10)
    assert set(plan.run) == {"b"}
    assert d.waiting_order() == ["c", "a"]
    assert d.jobs["a"].preemptions == 1


def test_ranking_follows_solved_shares_among_new_jobs() -> None:
    # Stubbed shares by job order (submit, id) a, b, c = 0.2, 0.7, 0.1: never-ran priority is
    # x × 1e9, so b, a, c. One 4-GPU node, 4-GPU jobs: b runs, a then c wait.
    d, policy = themis_driver()
    policy.lp = FixedShares([0.2, 0.7, 0.1])
    d.add(J("a"), J("b"), J("c"))
    assert set(d.cycle(0).run) == {"b"}
    assert policy.order == ["b", "a", "c"]
    assert d.waiting_order() == ["a", "c"]


def test_greedy_fill_skips_jobs_that_do_not_fit() -> None:
    # Shares a, b, c = 0.9, 0.8, 0.7 (never ran): a (2 GPUs) runs, b (4) does not fit in the
    # 2 left, c (1) does; b waits first in line for 4 GPUs with 1 free.
    d, policy = themis_driver()
    policy.lp = FixedShares([0.9, 0.8, 0.7])
    d.add(J("a", 2), J("b", 4), J("c", 1))
    plan = d.cycle(0)
    assert set(plan.run) == {"a", "c"}
    assert policy.order == ["a", "b", "c"]
    st = d.status("b")
    assert st.queue_position == 1 and st.decided_by == "themis"
    assert st.code is StatusCode.WAITING_FOR_GPUS and st.reason == "needs 4 GPUs, 1 free"


# --------------------------------------------------------------------------------------------
# fallbacks, statuses, removal
# --------------------------------------------------------------------------------------------

class NoShares(FairnessLp):
    """Every solve fails (as when every solver errors on a non-binding LP)."""

    def solve(self, a: np.ndarray, b: np.ndarray, gpus: np.ndarray,
              capacity: float) -> np.ndarray | None:
        self.stats.fallbacks += 1
        return None


def test_solver_failure_falls_back_to_equal_weight() -> None:
    # Muri's fallback: x = 1 for all, so priority 1e9 (never ran) or 1 / attained: least
    # attained time first. No fairness value is reported for such a cycle.
    d, policy = themis_driver()
    policy.lp = NoShares()
    d.add(J("a"), J("b"), J("c"))
    d.cycle(0)
    assert d.running == {"a"} and not policy.solved
    d.jobs["b"].attained_s = 5.0  # as if b had run 5 s before
    d.cycle(10)  # a: 10 s attained → 0.1; b: 0.2; c: never ran → 1e9
    assert policy.order == ["c", "b", "a"]
    assert all(x_of(policy, j) == 1.0 for j in "abc")
    assert policy.fairness("a") is None
    assert policy.lp.stats.fallbacks == 2


def test_degenerate_job_falls_back_without_crashing() -> None:
    # A job with no work left and no isolated time has iso = 0: rho is undefined.
    d, policy = themis_driver()
    d.add(J("a"), J("b"))
    d.jobs["a"].done = 100.0
    plan = d.cycle(0)
    assert not policy.solved and plan.run
    assert policy.lp.stats.fallbacks == 1


def test_every_waiting_job_has_a_status_with_its_rank() -> None:
    d, _ = themis_driver()
    d.add(J("a"), J("b"), J("c"), J("d"))
    d.cycle(0)
    waiting = d.waiting_order()  # asserts positions 1..n
    assert len(waiting) == 3
    for jid in waiting:
        st = d.status(jid)
        assert st.decided_by == "themis" and st.reason
        assert st.code is StatusCode.WAITING_FOR_PRIORITY
    # A job added after the last cycle has a status, with no position yet.
    d.add(J("e", 4, 100, 1))
    assert d.status("e").queue_position is None


def test_removed_jobs_lose_their_bookkeeping_and_leave_the_queue() -> None:
    d, policy = themis_driver()
    d.add(J("a"), J("b"), J("c"), J("d"))
    d.cycle(0)
    first, *rest = d.waiting_order()
    del d.jobs[first]
    policy.job_removed(first)
    assert policy.fairness(first) is None and policy.ledger(first) is None
    assert d.status(first).queue_position is None
    assert d.waiting_order() == rest  # positions closed up to 1..n


def test_running_job_finishing_drops_its_fairness() -> None:
    d, policy = themis_driver()
    d.add(J("a", 4, 10))
    d.cycle(0)
    assert policy.fairness("a") == pytest.approx(1.0, rel=1e-6)  # alone: x = 1, rho = b = 1
    d.advance(10)  # finishes: job_removed
    assert policy.fairness("a") is None


# --------------------------------------------------------------------------------------------
# determinism and end to end
# --------------------------------------------------------------------------------------------

SCENARIO = [J("a", 2, 300, 0), J("b", 4, 100, 50), J("c", 2, 100, 60), J("d", 1, 500, 70),
            J("e", 3, 80, 75), J("f", 1, 40, 200)]


def run_cycles() -> list[tuple[float, Plan]]:
    d, _ = themis_driver(cluster(2, 4))
    pending = sorted(SCENARIO, key=lambda s: s.submit_time_s)
    plans = []
    t = 0.0
    while pending or d.jobs:
        t += 25.0
        while pending and pending[0].submit_time_s <= t:
            d.advance(pending[0].submit_time_s)
            d.add(pending.pop(0))
        plans.append((t, d.cycle(t)))
    return plans


def test_same_inputs_same_plans() -> None:
    one, two = run_cycles(), run_cycles()
    assert [(t, p.run, p.blocked) for t, p in one] == [(t, p.run, p.blocked) for t, p in two]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(policies.REGISTRY, "themis", Themis)


@pytest.mark.usefixtures("registered")
def test_end_to_end_new_job_preempts_by_hand() -> None:
    # One node of 4 GPUs. a (4 GPUs, 100 s) @0 runs alone (x = 1). b (4 GPUs, 50 s) @10 never
    # ran → priority x × 1e9 beats a's x / 10: b runs 10–60 (JCT 50), a resumes 60–150.
    jobs = [J("a", 4, 100, 0), J("b", 4, 50, 10)]
    result = simulate(jobs, "themis", cluster(1, 4))
    jct = {j.job_id: j.jct_s for j in result.jobs}
    assert jct == {"a": pytest.approx(150.0), "b": pytest.approx(50.0)}
    assert {j.job_id: j.preemptions for j in result.jobs} == {"a": 1, "b": 0}


@pytest.mark.usefixtures("registered")
def test_end_to_end_finishes_everything_deterministically() -> None:
    first = simulate(SCENARIO, "themis", cluster(2, 4), overhead="muri")
    second = simulate(SCENARIO, "themis", cluster(2, 4), overhead="muri")
    assert first.summary["finished"] == len(SCENARIO)
    assert first.summary["unfinished"] == 0 and first.summary["errors"] == 0
    assert first.summary["decision_digest"] == second.summary["decision_digest"]
    assert first.summary["avg_jct_s"] == second.summary["avg_jct_s"]
