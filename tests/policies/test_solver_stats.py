"""A run's summary says what the policy's solver did (`Policy.solver_stats`): every policy
that solves counts its solves and seconds, and what it could not use; the others say nothing."""

from __future__ import annotations

import pytest

from schemas.cluster import ClusterSpec, NodeSpec
from schemas.job import JobSpec
from tests.builders import make_job, simulate

# Policy → the count that must be positive after a run that gave it work.
SOLVING = {
    "max-min-fairness": "solves",
    "max-min-fairness-perf": "solves",
    "max-min-fairness-water-filling": "solves",
    "min-makespan": "solves",
    "finish-time-fairness": "solves",
    "min-cost": "solves",
    "max-min-fairness-packed": "solves",
    "themis": "solves",
    "chronus": "terms",
}
SILENT = ["srtf", "tiresias", "fifo-random", "gandiva"]


def _cluster() -> ClusterSpec:
    """Two GPU types, so the allocations have columns to share."""
    nodes = [NodeSpec(node_id=f"{t}-{i}", gpus=2, gpu_type=t, switch_id="s0")
             for t in ("v100", "k80") for i in range(2)]
    return ClusterSpec(name="two-types", nodes=nodes)


def _jobs() -> list[JobSpec]:
    """More jobs than GPUs, arriving apart, so allocations are made again and again."""
    return [make_job(f"j{i}").gpus(1 + i % 2).iterations(300 + 50 * i).submit(60.0 * i)
            .deadline(5_000.0 + 600.0 * i).build() for i in range(12)]


@pytest.mark.parametrize("policy", sorted(SOLVING))
def test_a_solving_policy_reports_its_solver(policy: str) -> None:
    summary = simulate(_jobs(), policy, _cluster()).summary
    assert summary["finished"] == 12
    stats = summary["solver"]
    assert isinstance(stats, dict)
    assert stats[SOLVING[policy]] > 0
    assert stats["total_s"] >= 0.0
    assert stats.get("fallbacks", 0) == 0  # these small LPs always solve
    assert all(isinstance(v, int | float) for v in stats.values())


@pytest.mark.parametrize("policy", SILENT)
def test_a_policy_that_solves_nothing_reports_no_solver(policy: str) -> None:
    summary = simulate(_jobs(), policy, _cluster()).summary
    assert summary["finished"] == 12
    assert "solver" not in summary
