"""Lenders get their nominal GPUs back within one round: regressions found by bench/queues.py
on muri/trace3 (three queues in a cohort, docs/validation.md).

- ElasticFlow planned GPUs for jobs the queue layer then refused and gave them to no one else:
  they idled, and a lender's jobs, planned at 0, never reclaimed anything (on trace3: avg JCT
  4.3x the run without queues, GPU utilisation 0.60 against 0.82, 36,817 cycles against 2,073).
- A queue growing within its own nominal quota in the walk (srtf starting a wide job of its own
  in place of narrower running ones) took the idle quota another queue's claim counted on,
  while a third queue borrowed: the claimant waited for the next event (1,114 s under srtf,
  4,144 s under themis on trace3).
- A queue whose new job took its running jobs' room left the quota reclaim had just freed for
  it idle, and the victim's queue borrowed it straight back.
"""

from __future__ import annotations

import asyncio

from loom.simulate import SimConfig, run_simulation
from schemas.status import StatusCode
from tests.builders import cluster, make_job
from tests.policies.mechanisms.queue_fixtures import Cycle, job, queues
from tests.policies.test_queue_reclaim_sim import B_AT, C_AT, TENANTS, workload

SLOT_S = 60.0  # ElasticFlow's slot: its one round


def test_elasticflow_lenders_get_their_nominal_gpus_back_within_a_slot() -> None:
    result = asyncio.run(run_simulation(SimConfig(
        policy="elasticflow", jobs=workload(), cluster=cluster(3, 8), tenants=TENANTS)))
    starts = {j.job_id: j.start_s for j in result.jobs}
    for jid in ("b0", "b1"):
        start = starts[jid]
        assert start is not None and B_AT <= start <= B_AT + SLOT_S
    for i in range(8):
        start = starts[f"c{i}"]
        assert start is not None and C_AT <= start <= C_AT + SLOT_S
    summary = result.summary
    assert summary["finished"] == len(workload()) and summary["errors"] == 0
    assert summary["reclaims"] == 8  # as under fifo, srtf and tiresias: four of a's jobs each
    cycles = summary["cycles"]
    assert isinstance(cycles, int) and cycles < 100  # no slot after slot of refused plans


def test_a_claim_left_unmet_by_the_walk_asks_to_replan_at_once() -> None:
    """b's job fits the pool's idle 2 GPUs as the cycle begins (no reclaim), but a's wide job,
    ranked first, takes them within a's nominal quota in place of a's running job, and the
    policy never reaches b's. c still borrows: re-plan now, and the next cycle reclaims."""
    cycle = Cycle(queues(a={"nominal": 4}, b={"nominal": 2}, c={"nominal": 2}),
                  running=[(job("a1", "a", 2), 0.0), (job("c1", "c", 2), 0.0),
                           (job("c2", "c", 2), 0.0)],
                  waiting=[job("wide", "a", 4), job("b1", "b", 2)], cl=cluster(2, 4))
    cycle.order = ["wide", "c1", "c2"]  # a1 dropped, b1 never tried
    placed, gate = cycle.walk()
    assert placed == ["wide", "c1", "c2"] and gate.reclaimed == {}
    assert gate.wakeup_at == cycle.now
    # The same cycle with b's claim met (no borrower left to take from): nothing to re-plan.
    alone = Cycle(cycle.config, running=cycle.running[:1], waiting=cycle.waiting,
                  cl=cluster(2, 4), order=["wide", "b1"])
    placed, gate = alone.walk()
    assert placed == ["wide", "b1"] and gate.wakeup_at is None


def test_no_replan_for_a_claim_whose_borrowers_are_too_young() -> None:
    young = {"nominal": 2, "min_runtime_s": 600}
    cycle = Cycle(queues(a={"nominal": 4}, b={"nominal": 2}, c=young),
                  running=[(job("a1", "a", 2), 0.0), (job("c1", "c", 2), 90.0),
                           (job("c2", "c", 2), 90.0)],
                  waiting=[job("wide", "a", 4), job("b1", "b", 2)], cl=cluster(2, 4),
                  order=["wide", "c1", "c2"])
    _, gate = cycle.walk()
    assert gate.wakeup_at is None


def test_reclaimed_quota_is_not_borrowed_back_by_the_victims_queue() -> None:
    """a (nominal 4) holds 2 and waits for 2 more, which b borrowed: b2 is reclaimed. a's new
    job, ranked first, takes a1's room within a's quota, so a1, walked last, needs the pool's
    2 GPUs: b3 may not borrow them back in between."""
    cycle = Cycle(queues(a={"nominal": 4}, b={"nominal": 4}),
                  running=[(job("a1", "a", 2), 0.0), (job("b1", "b", 4), 0.0),
                           (job("b2", "b", 2), 50.0)],
                  waiting=[job("a2", "a", 2), job("b3", "b", 2)], cl=cluster(2, 4),
                  order=["a2", "b1", "b3", "a1"])
    placed, gate = cycle.walk()
    assert gate.reclaimed == {"b2": "a"}
    assert placed == ["a2", "b1", "a1"]
    assert gate.held["b3"].code is StatusCode.WAITING_FOR_QUOTA_IN_COHORT


def test_in_rounds_a_claim_left_unmet_is_met_in_the_same_round() -> None:
    """The walk's shape above, through a round-based simulation: at the tick, a's wide job
    takes the idle quota b's job counted on while c borrows. The re-plan the queues ask for
    at that instant runs then, not a round later: b1 starts at the tick that first saw it."""
    tenants = queues(a={"nominal": 4}, b={"nominal": 2}, c={"nominal": 2})
    jobs = [make_job("a1").tenant("a").gpus(2).runs_for(50_000).build(),
            make_job("c1").tenant("c").gpus(2).runs_for(20_000).build(),
            make_job("c2").tenant("c").gpus(2).runs_for(20_000).build(),
            make_job("wide").tenant("a").gpus(4).runs_for(1_000).submit(100).build(),
            make_job("b1").tenant("b").gpus(2).runs_for(30_000).submit(100).build()]
    for round_s, tick in ((None, 100.0), (360.0, 360.0)):
        result = asyncio.run(run_simulation(SimConfig(
            policy="srtf", jobs=jobs, cluster=cluster(2, 4), tenants=tenants,
            round_s=round_s)))
        starts = {j.job_id: j.start_s for j in result.jobs}
        assert starts["wide"] == starts["b1"] == tick, (round_s, starts)
        assert result.summary["reclaims"] == 1
