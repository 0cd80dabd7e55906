"""Reclaim end to end: three queues in a cohort through the real simulation.

Queue a borrows the whole cluster while b and c are idle; when b's, then c's jobs arrive they
get their nominal GPUs back within one round (event-driven: at once), by preempting a's jobs
with the cause "preempted: reclaimed by queue ...". The simulated stop is instantaneous (the
live node agent's checkpoint grace period has no simulated counterpart), so "within one round
plus the grace period" is "within one round" here.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from loom.simulate import SimConfig, SimResult, run_simulation
from schemas.job import JobSpec
from schemas.tenants import TenantsConfig, parse_tenants
from tests.builders import cluster, make_job
from tests.policies.test_gang_admission import CLUSTERS, checked_plans, jobs

TENANTS = parse_tenants({
    "cohorts": {"research": {"half_life_s": 3600}},
    "queues": {q: {"cohort": "research", "tenants": [q], "nominal": 8} for q in "abc"},
}, "queues.toml")
B_AT, C_AT = 1000.0, 2500.0


def workload() -> list[JobSpec]:
    jobs = [make_job(f"a{i}").tenant("a").gpus(2).runs_for(20_000).build() for i in range(12)]
    jobs += [make_job(f"b{i}").tenant("b").gpus(4).runs_for(3000).submit(B_AT).build()
             for i in range(2)]
    jobs += [make_job(f"c{i}").tenant("c").gpus(1).runs_for(3000).submit(C_AT).build()
             for i in range(8)]
    return jobs


def run(policy: str, round_s: float | None) -> SimResult:
    return asyncio.run(run_simulation(SimConfig(
        policy=policy, jobs=workload(), cluster=cluster(3, 8), tenants=TENANTS,
        round_s=round_s)))


@pytest.mark.parametrize(("policy", "round_s"), [
    ("fifo", None), ("srtf", None), ("tiresias", None), ("srtf", 360.0)])
def test_lenders_get_their_nominal_gpus_back_within_a_round(policy: str,
                                                            round_s: float | None) -> None:
    result = run(policy, round_s)
    starts = {j.job_id: j.start_s if j.start_s is not None else -1.0 for j in result.jobs}
    allowed = round_s or 0.0
    for jid in ("b0", "b1"):
        assert B_AT <= starts[jid] <= B_AT + allowed
    for i in range(8):
        assert C_AT <= starts[f"c{i}"] <= C_AT + allowed
    summary = result.summary
    assert summary["finished"] == len(workload())  # every hold ends
    # b takes back 8 GPUs (four of a's 2-GPU jobs), c 8 more (four others).
    assert summary["reclaims"] == 8
    assert isinstance(summary["reclaim_lost_gpu_h"], float) and summary["reclaim_lost_gpu_h"] > 0
    victims = {j.job_id for j in result.jobs if j.preemptions}
    assert victims and all(v.startswith("a") for v in victims)


def test_without_queues_nobody_takes_anything_back() -> None:
    result = asyncio.run(run_simulation(SimConfig(
        policy="fifo", jobs=workload(), cluster=cluster(3, 8),
        tenants=parse_tenants({"tenants": {q: {} for q in "abc"}}, "tenants.toml"))))
    [b0] = [j for j in result.jobs if j.job_id == "b0"]
    assert b0.start_s is not None and b0.start_s >= 20_000  # waits for a's jobs to end
    assert result.summary["reclaims"] == 0 and result.summary["preemptions"] == 0


queue_files = st.builds(
    lambda na, nb, bl, ll, mr: parse_tenants({
        "cohorts": {"c": {}},
        "queues": {"a": {"cohort": "c", "tenants": ["a"], "nominal": na, "min_runtime_s": mr,
                         **({} if bl is None else {"borrowing_limit": bl})},
                   "b": {"cohort": "c", "tenants": ["b"], "nominal": nb,
                         **({} if ll is None else {"lending_limit": min(ll, nb)})}}},
        "queues.toml"),
    st.sampled_from([2, 4, 8]), st.sampled_from([0, 4, 8]), st.sampled_from([None, 0, 4]),
    st.sampled_from([None, 0, 2]), st.sampled_from([0, 100]))


@pytest.mark.parametrize("policy", sorted(policies.REGISTRY))
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(trace=jobs(), where=st.sampled_from(sorted(CLUSTERS)), tenants=queue_files)
def test_every_policy_under_queues(policy: str, trace: list[JobSpec], where: str,
                                   tenants: TenantsConfig) -> None:
    """The layer over every policy: no split gang, no double booking, every job admitted
    finishes (a hold or a reclaim is never permanent), no queue past its limits."""
    with checked_plans() as found:
        result = asyncio.run(run_simulation(SimConfig(policy=policy, jobs=trace,
                                                      cluster=CLUSTERS[where],
                                                      tenants=tenants)))
    assert found == []
    assert result.summary["errors"] == 0
    assert result.summary["finished"] + result.summary["rejected"] == len(trace)  # type: ignore[operator]
