"""Space sharing (Gavel's packed policies): pair candidates, co-located speeds, the LP."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from domain.overhead import job_rates, parse_overhead
from policies.base import Snapshot
from policies.gandiva import Gandiva
from policies.max_min_fairness_packed import MaxMinFairnessPacked
from policies.mechanisms.allocation import AllocationInput, PairTable
from schemas.cluster import ClusterSpec
from schemas.throughputs import ThroughputTable
from tests.builders import make_job, simulate, view


def profile(together: float = 0.8, gpus: int = 1) -> ThroughputTable:
    """Two job types A and B at 1 it/s alone on v100; `together` it/s each when sharing."""
    a, b = ("A", gpus), ("B", gpus)
    iso = {"v100": {a: 1.0, b: 1.0}}
    co = {"v100": {(a, b): (together, together), (b, a): (together, together),
                   (a, a): (together, together), (b, b): (together, together)}}
    return ThroughputTable(Path("test.json"), iso, co)


def job(jid: str, jt: str = "A", gpus: int = 1, iterations: int = 1000, submit: float = 0.0):
    return (make_job(jid).gpus(gpus).iterations(iterations).submit(submit).rates(v100=1.0)
            .build().model_copy(update={"job_type": jt}))


def snapshot(*specs, cluster: ClusterSpec) -> Snapshot:
    views = {s.job_id: view(s) for s in specs}
    return Snapshot(0.0, cluster, MappingProxyType(views), ())


V100_1 = ClusterSpec.heterogeneous({"v100": 1}, 1)


def test_pair_candidates_need_equal_gpu_counts_and_a_profile() -> None:
    cl = ClusterSpec.heterogeneous({"v100": 4}, 4)
    snap = snapshot(job("a"), job("b", "B"), job("c", gpus=2), job("d", "Unknown"), cluster=cl)
    inp = AllocationInput.from_snapshot(snap, ("v100",))
    pairs = PairTable.build(snap, inp, profile())
    assert pairs.combos == [("a", "b")]
    np.testing.assert_allclose(pairs.throughputs[0, 0], [0.8, 0.8])


def test_colocated_jobs_run_at_the_profiled_rate() -> None:
    a, b = job("a"), job("b", "B")
    model = parse_overhead("none")
    assert job_rates(a, [a, b], model, "v100", profile(0.8))[0] == pytest.approx(1 / 0.8)
    assert job_rates(a, [a], model, "v100", profile(0.8))[0] == pytest.approx(1.0)


@pytest.mark.parametrize(("together", "pair_share"), [(0.8, 1.0), (0.4, 0.0)])
def test_packed_lp_shares_a_gpu_only_when_it_pays(together: float, pair_share: float) -> None:
    # Two jobs, one GPU: alone each gets half (normalised throughput 1); together at 0.8 it/s
    # each they reach 1.6, so the pair takes the GPU; at 0.4 sharing loses, so it does not.
    snap = snapshot(job("a"), job("b", "B"), cluster=V100_1)
    inp = AllocationInput.from_snapshot(snap, ("v100",))
    pairs = PairTable.build(snap, inp, profile(together))
    x = MaxMinFairnessPacked().allocate_packed(inp, pairs)
    assert x.shape == (3, 1)
    assert x[2, 0] == pytest.approx(pair_share, abs=1e-4)


def test_gandiva_pairs_only_when_jobs_do_not_fit() -> None:
    g = Gandiva()
    g.configure(seed=1, round_s=360.0, profile=profile())
    fits = snapshot(job("a"), cluster=ClusterSpec.heterogeneous({"v100": 2}, 2))
    inp = AllocationInput.from_snapshot(fits, ("v100",))
    x = g.allocate_packed(inp, PairTable.build(fits, inp, profile()))
    assert x.shape == (1, 1) and x[0, 0] == 1.0
    crowded = snapshot(job("a"), job("b", "B"), cluster=V100_1)
    inp = AllocationInput.from_snapshot(crowded, ("v100",))
    x = g.allocate_packed(inp, PairTable.build(crowded, inp, profile()))
    np.testing.assert_allclose(x[:, 0], [0.0, 0.0, 1.0])  # the pair gets the GPU


def test_gandiva_normalised_throughput_decides_which_pairs_stay() -> None:
    # Gavel's measure: Σ over types and members of co-located / alone throughput
    from policies.gandiva import _normalised

    snap = snapshot(job("a"), job("b", "B"), cluster=V100_1)
    inp = AllocationInput.from_snapshot(snap, ("v100",))
    assert _normalised(inp, PairTable.build(snap, inp, profile(0.8)), 0) == pytest.approx(1.6)
    assert _normalised(inp, PairTable.build(snap, inp, profile(0.2)), 0) == pytest.approx(0.4)


def test_gandiva_forgets_a_pair_when_a_member_leaves() -> None:
    g = Gandiva()
    g.configure(seed=1, round_s=360.0, profile=profile())
    crowded = snapshot(job("a"), job("b", "B"), cluster=V100_1)
    inp = AllocationInput.from_snapshot(crowded, ("v100",))
    g.allocate_packed(inp, PairTable.build(crowded, inp, profile()))
    alone = snapshot(job("a"), cluster=V100_1)
    inp = AllocationInput.from_snapshot(alone, ("v100",))
    x = g.allocate_packed(inp, PairTable.build(alone, inp, profile()))
    np.testing.assert_allclose(x[:, 0], [1.0])


def test_packed_policy_end_to_end_runs_pairs_together() -> None:
    # Two 1000-iteration jobs on one GPU at 0.8 it/s each when shared: both done by about
    # 1250 s (plus round granularity), instead of 1000 s and 2000 s one after the other.
    import asyncio

    from loom.simulate import SimConfig, run_simulation

    jobs = [job("a"), job("b", "B")]
    cfg = SimConfig(policy="max-min-fairness-packed", jobs=jobs, cluster=V100_1,
                    profile=profile(0.8))
    result = asyncio.run(run_simulation(cfg))
    ends = sorted(j.jct_s or 0 for j in result.jobs)
    assert ends[1] < 1500
    assert result.summary["finished"] == 2
    assert simulate(jobs, "max-min-fairness-perf", V100_1).summary["makespan_s"] > 1900
