"""Gavel's round mechanism: priorities, deficits, resets, lease extension, GPU types."""

from __future__ import annotations

import numpy as np
import pytest

import policies
from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import FloatArray
from policies.mechanisms.rounds import RoundPolicy
from schemas.cluster import ClusterSpec
from tests.builders import make_job, simulate
from tests.policies.driver import Driver


class Fixed(RoundPolicy):
    """A policy whose allocation is given: isolates the mechanism."""

    name = "fixed"
    description = "test"

    def __init__(self, x: list[list[float]]) -> None:
        super().__init__()
        self.x = np.array(x)
        self.calls = 0

    def allocate(self, inp: AllocationInput) -> FloatArray:
        self.calls += 1
        return self.x[: len(inp.job_ids)]


def one_type(gpus: int, gpu_type: str = "v100") -> ClusterSpec:
    return ClusterSpec.heterogeneous({gpu_type: gpus}, gpus)


def rounds(driver: Driver, n: int, round_s: float = 360.0) -> list[list[str]]:
    ran = []
    for _ in range(n):
        plan = driver.cycle()
        ran.append(sorted(plan.run))
        driver.advance(driver.now + round_s)
    return ran


def test_two_jobs_with_half_shares_alternate_rounds() -> None:
    policy = Fixed([[0.5], [0.5]])
    d = Driver(policy, one_type(1)).add(make_job("a").runs_for(10_000).build(),
                                        make_job("b").runs_for(10_000).build())
    assert rounds(d, 6) == [["a"], ["b"], ["a"], ["b"], ["a"], ["b"]]


def test_shares_are_realised_in_proportion() -> None:
    # 3:1 shares of one GPU over 8 rounds: 6 rounds for a, 2 for b
    policy = Fixed([[0.75], [0.25]])
    d = Driver(policy, one_type(1)).add(make_job("a").runs_for(10**6).build(),
                                        make_job("b").runs_for(10**6).build())
    ran = rounds(d, 8)
    assert sum(r == ["a"] for r in ran) == 6


def test_allocation_recomputed_at_most_every_reset_interval_after_the_first() -> None:
    policy = Fixed([[0.5], [0.5], [0.5]])
    d = Driver(policy, one_type(1)).add(make_job("a").runs_for(10**6).build())
    d.now = 360.0  # first allocation happens away from t = 0
    rounds(d, 1)
    assert policy.calls == 1
    d.add(make_job("b").submit(d.now).runs_for(10**6).build())
    rounds(d, 4)  # 4 × 360 s < 1920 s since the reset: no recomputation yet
    assert policy.calls == 1
    rounds(d, 2)
    assert policy.calls == 2


def test_a_job_keeps_its_gpus_across_rounds() -> None:
    policy = Fixed([[1.0], [1.0]])
    d = Driver(policy, one_type(4)).add(make_job("a").gpus(2).runs_for(10**6).build(),
                                        make_job("b").gpus(2).runs_for(10**6).build())
    first = d.cycle().run
    d.advance(d.now + 360)
    second = d.cycle().run
    assert first == second


def test_a_continuing_job_keeps_its_gpus_before_a_new_job_of_its_size_is_placed() -> None:
    # a and b fill both GPUs; c arrives and, never having run, ranks first. a (first of the
    # tied pair) runs on, b sits out. c would take the lowest held GPU, a's, were it placed
    # first; Gavel places the jobs that ran on a type last round first, so a keeps GPU 0.
    policy = Fixed([[2 / 3], [2 / 3], [2 / 3]])
    policy.reset_interval_s = 0.0  # the allocation is recomputed as soon as c arrives
    d = Driver(policy, one_type(2)).add(make_job("a").runs_for(10**6).build(),
                                        make_job("b").runs_for(10**6).build())
    first = dict(d.cycle().run)
    assert set(first) == {"a", "b"}
    d.advance(360.0)
    d.add(make_job("c").submit(360.0).runs_for(10**6).build())
    second = d.cycle().run
    assert set(second) == {"a", "c"}
    assert second["a"] == first["a"]
    assert second["c"] == first["b"]


def test_zero_throughput_type_is_never_used() -> None:
    cl = ClusterSpec.heterogeneous({"v100": 1, "k80": 1}, 1)
    job = make_job("a").runs_for(10**6).rates(v100=1.0, k80=0.0).build()
    policy = Fixed([[0.5, 0.5]])
    d = Driver(policy, cl).add(job)
    for _ in range(3):
        plan = d.cycle()
        assert all(node.startswith("v100") for node, _ in plan.run["a"])
        d.advance(d.now + 360)


@pytest.mark.parametrize(("aware", "agnostic"), [
    ("max-min-fairness-perf", "max-min-fairness"),
    ("finish-time-fairness-perf", "finish-time-fairness"),
    ("fifo-perf", "fifo-random"),
])
def test_heterogeneity_aware_policy_beats_its_agnostic_twin(aware: str, agnostic: str) -> None:
    # Jobs 4x faster on v100 than on k80, half of them 4x faster again on v100 only: an aware
    # policy sends each job where it gains most.
    cl = ClusterSpec.heterogeneous({"v100": 4, "k80": 4}, 4)
    jobs = []
    for i in range(16):
        fast = 8.0 if i % 2 else 2.0
        jobs.append(make_job(f"j{i}").rates(v100=fast, k80=0.5).iterations(
            int(3600 * fast)).submit(i * 300.0).build())
    jct = {p: simulate(jobs, p, cl).summary["avg_jct_s"] for p in (aware, agnostic)}
    assert jct[aware] < jct[agnostic]  # type: ignore[operator]


def test_same_seed_same_decisions() -> None:
    cl = ClusterSpec.heterogeneous({"v100": 4, "p100": 4, "k80": 4}, 4)
    jobs = [make_job(f"j{i}").rates(v100=2.0, p100=1.0, k80=0.5).iterations(2000 + 300 * i)
            .submit(100.0 * i).build() for i in range(12)]
    for name in ("max-min-fairness", "fifo-random"):
        a = simulate(jobs, name, cl, seed=7).summary
        b = simulate(jobs, name, cl, seed=7).summary
        assert a["decision_digest"] == b["decision_digest"]
        assert name in policies.REGISTRY


def test_policy_refusal_rejects_the_job_with_its_reason() -> None:
    cl = ClusterSpec.heterogeneous({"v100": 4, "k80": 4}, 4)
    jobs = [make_job("one").rates(v100=2.0, k80=1.0).iterations(1000).build(),
            make_job("two").gpus(2).rates(v100=2.0, k80=1.0).iterations(1000).build()]
    result = simulate(jobs, "allox", cl)
    assert result.summary["rejected"] == 1
    assert result.summary["finished"] == 1


def test_free_at_once_backfills_gpus_freed_mid_round() -> None:
    # One GPU; a short job finishes 60 s into the first round. Gavel's way the second job
    # waits for the round to end (360 s); with free_at_once it starts at 60 s.
    cl = one_type(1)
    jobs = [make_job("short").iterations(60).rates(v100=1.0).build(),
            make_job("long").iterations(600).rates(v100=1.0).build()]
    gavel = {j.job_id: j.jct_s for j in simulate(jobs, "max-min-fairness-perf", cl).jobs}
    eager = {j.job_id: j.jct_s for j in simulate(jobs, "max-min-fairness-perf", cl,
                                                 free_at_once=True).jobs}
    assert gavel["short"] == eager["short"] == pytest.approx(60.0)
    assert eager["long"] == pytest.approx(660.0)
    assert gavel["long"] == pytest.approx(960.0)


def test_a_run_can_stop_once_the_awaited_jobs_finish() -> None:
    # Gavel's jobs_to_complete: the run ends when jobs 0 and 1 are done, job 2 never finishes
    cl = one_type(1)
    jobs = [make_job(str(i)).iterations(100 * (i + 1)).rates(v100=1.0).submit(i).build()
            for i in range(3)]
    full = simulate(jobs, "fifo-perf", cl)
    early = simulate(jobs, "fifo-perf", cl, stop_after=frozenset({"0", "1"}))
    assert full.summary["finished"] == 3 and not full.summary["stopped_early"]
    assert early.summary["stopped_early"]
    done = {j.job_id: j.jct_s for j in early.jobs if j.jct_s is not None}
    assert set(done) == {"0", "1"}
    assert done == {j.job_id: j.jct_s for j in full.jobs if j.job_id in done}
