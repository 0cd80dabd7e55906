"""Muri-S / Muri-L: ranking, candidates, grouping, autopack and co-located placement."""

from __future__ import annotations

import pytest

from domain.overhead import parse_overhead
from policies.muri import MuriL, MuriS
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from tests.builders import cluster, make_job, simulate, view
from tests.policies.driver import Driver

A, B = (1.0, 2.0, 0.0), (2.0, 1.0, 0.0)  # complementary: data of one under compute of other
COMM = (0.0, 0.0, 1.0)  # communication only: interleaving two of these only adds overhead


def job(jid: str, stages: tuple[float, ...], iterations: int = 100, gpus: int = 1,
        submit: float = 0.0, duration: float | None = None) -> JobSpec:
    return JobSpec(job_id=jid, model="m", gpus=gpus, iterations=iterations,
                   iteration_time_s=sum(stages), stage_times_s=stages, submit_time_s=submit,
                   duration_s=duration)


ONE_GPU = ClusterSpec.uniform(1, 1, 1)


@pytest.mark.parametrize("policy", ["muri-s", "muri-l"])
def test_complementary_jobs_share_one_gpu_and_both_finish_sooner(policy: str) -> None:
    # Alone: 100 × 3 s each, 300 s then 600 s (avg 450). Together: period 3 s (data of one under
    # compute of the other) × Muri's 2-job factor 1.33/1.015, for both: 393.1 s each.
    result = simulate([job("a", A), job("b", B)], policy, ONE_GPU)
    ends = {j.job_id: j.end_s for j in result.jobs}
    assert ends["a"] == pytest.approx(300 * 1.33 / 1.015)
    assert ends["b"] == pytest.approx(300 * 1.33 / 1.015)
    assert result.summary["gpu_util"] == pytest.approx(1.0)  # a shared GPU counts once
    assert result.summary["interleaved_launches"] == 2


def test_a_group_slower_than_its_members_in_turn_is_split() -> None:
    # Two communication-bound jobs: together 2 s × 1.33/1.015 = 2.62 s per iteration each,
    # apart 1 s × 1.015 twice = 2.03 s: autopack runs them one after the other.
    d = Driver.of("muri-s", ONE_GPU).add(job("a", COMM), job("b", COMM, submit=1.0))
    plan = d.cycle(0.0)
    assert list(plan.run) == ["a"] and plan.groups == {}


def test_plan_places_a_group_on_the_same_gpus() -> None:
    d = Driver.of("muri-s", cluster(1, 2)).add(
        job("a", A), job("b", B), job("c", A), job("d", B), job("e", A))
    plan = d.cycle(0.0)
    groups = {plan.groups[j] for j in plan.groups}
    assert all(len({plan.run[m] for m in g}) == 1 for g in groups)  # members share slots
    assert len({plan.run[j] for j in plan.run}) <= 2  # 2 GPUs
    assert set(plan.groups) <= set(plan.run)


def test_muri_s_ranks_a_job_that_never_ran_by_its_trace_duration() -> None:
    # Muri's quirk: before a job first runs, its rank uses the trace's `duration`, not
    # iterations × iteration time. x claims a short duration, y a long one.
    policy = MuriS()
    x = job("x", A, iterations=1000, duration=10.0)
    y = job("y", A, iterations=10, duration=10_000.0)
    from tests.builders import view
    assert policy.sort_value(view(x)) == 10.0 < policy.sort_value(view(y))
    ran = view(x, running=True, done=500, attained=1500)
    assert policy.sort_value(ran) == pytest.approx(500 * 3.0 * 1.015)


def test_muri_l_ranks_by_attained_gpu_time_and_breaks_ties_like_muri() -> None:
    policy = MuriL()
    from tests.builders import view
    old_small, old_big = job("os", A, gpus=1), job("ob", A, gpus=4)
    new = job("n", A, gpus=8)
    for spec in (old_small, old_big):
        policy.job_added(view(spec))
    policy._new.clear()
    policy.job_added(view(new))
    keys = sorted(["os", "ob", "n"], key=lambda j: policy.key(view(
        {"os": old_small, "ob": old_big, "n": new}[j])))
    assert keys == ["ob", "os", "n"]  # old before new, bigger gangs first
    assert policy.sort_value(view(old_big, attained=10.0)) == 40.0  # GPU-seconds


def test_candidates_are_at_most_four_per_job_that_fits() -> None:
    # One GPU: a fits on the empty cluster and brings in the next 3 one-GPU jobs.
    d = Driver.of("muri-s", ONE_GPU).add(*[job(f"j{i}", A if i % 2 else B, iterations=10 + i)
                                          for i in range(6)])
    plan = d.cycle(0.0)
    assert len(plan.run) <= 4
    assert {"j4", "j5"}.isdisjoint(plan.run)


def test_every_waiting_job_gets_a_status_with_a_position() -> None:
    d = Driver.of("muri-l", ONE_GPU).add(*[job(f"j{i}", COMM, submit=i) for i in range(3)])
    plan = d.cycle(0.0)
    for jid in d.jobs:
        if jid not in plan.run:
            st = d.status(jid)
            assert st.queue_position is not None and st.reason


def test_same_trace_same_decisions() -> None:
    jobs = [make_job(f"j{i}").gpus(1 + (i % 3 == 0)).runs_for(50 + 17 * i).submit(5 * i).build()
            for i in range(12)]
    jobs = [j.model_copy(update={"stage_times_s": (0.3, 0.5 + (k % 2) * 0.4, 0.2)})
            for k, j in enumerate(jobs)]
    one = simulate(jobs, "muri-s", cluster(1, 2), overhead="muri")
    two = simulate(jobs, "muri-s", cluster(1, 2), overhead="muri")
    assert one.summary["decision_digest"] == two.summary["decision_digest"]
    assert one.summary["finished"] == 12


@pytest.mark.parametrize(("overhead", "first"), [
    (None, "n"), ("muri", "n"),  # r: 1000 s × 1.015 = 1015 left, n: 1010 → n first
    ("none", "r"), ("flat:30", "r"),  # r: 1000 s left → r first
])
def test_remaining_time_is_ranked_by_the_runs_overhead_model(overhead: str | None,
                                                             first: str) -> None:
    """Muri's simulator runs iterations 1.5 % slower than the trace says, as the `muri`
    overhead model does; Muri-S ranks remaining time by the run's model (Muri's own when the
    policy is not configured with one), and a job that never ran by its trace duration."""
    p = MuriS()
    if overhead is not None:
        p.configure(seed=0, round_s=360.0, overhead=parse_overhead(overhead))
    r = view(job("r", (1.0, 0.0, 0.0), iterations=1000), running=True, attained=1.0)
    n = view(job("n", (1.0, 0.0, 0.0), iterations=1000, duration=1010.0))
    for v in (r, n):
        p.job_added(v)
    assert min((r, n), key=p.key).job_id == first
