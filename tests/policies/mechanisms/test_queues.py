"""The queue layer as a pure function: nominal quotas, borrowing, lending, reclaim, fair share.

Each case names the Kueue behaviour it checks (docs/queues.md has the table, case by case).
"""

from __future__ import annotations

import pytest

from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from schemas.status import StatusCode
from tests.policies.mechanisms.queue_fixtures import Cycle, job, ones, queues

W = StatusCode.WAITING_FOR_QUOTA_IN_COHORT
HETERO = ClusterSpec.heterogeneous({"a100": 4, "v100": 4}, 4)


def since(specs: list[JobSpec], t: float) -> list[tuple[JobSpec, float]]:
    return [(s, t) for s in specs]


# (name, cycle, jobs placed, {held job: status code}, {victim: lender})
CASES = [
    ("K1 within nominal quota a queue always starts",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4}), waiting=ones("a", 4) + ones("b", 4)),
     [*(f"a{i}" for i in range(4)), *(f"b{i}" for i in range(4))], {}, {}),
    ("K2 a queue borrows the idle quota of its cohort",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4}), waiting=ones("a", 8)),
     [f"a{i}" for i in range(8)], {}, {}),
    ("K3 borrowing stops at the borrowing limit",
     Cycle(queues(a={"nominal": 4, "borrowing_limit": 1}, b={"nominal": 4}),
           waiting=ones("a", 6)),
     [f"a{i}" for i in range(5)], {"a5": StatusCode.BORROWING_LIMIT}, {}),
    ("K4 a lender lends no more than its lending limit",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4, "lending_limit": 1}),
           waiting=ones("a", 6)),
     [f"a{i}" for i in range(5)], {"a5": StatusCode.LENDING_LIMIT}, {}),
    ("K5 a queue in no cohort holds at most its nominal quota",
     Cycle(queues(cohort=None, a={"nominal": 3}), waiting=ones("a", 5)),
     ["a0", "a1", "a2"],
     {"a3": StatusCode.WAITING_FOR_QUEUE_QUOTA, "a4": StatusCode.WAITING_FOR_QUEUE_QUOTA}, {}),
    ("K6 queues within their nominal quota go before a borrower, whatever the walk order",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4}), waiting=ones("a", 6) + ones("b", 4)),
     [*(f"a{i}" for i in range(4)), *(f"b{i}" for i in range(4))], {"a4": W, "a5": W}, {}),
    ("K7 a lender's waiting job reclaims its lent quota: newest runs first",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4}),
           running=[*since(ones("a", 6), 0.0), (job("a6", "a"), 50.0), (job("a7", "a"), 90.0)],
           waiting=ones("b", 2)),
     [*(f"a{i}" for i in range(6)), "b0", "b1"],
     {"a6": StatusCode.RECLAIMED_BY_QUEUE, "a7": StatusCode.RECLAIMED_BY_QUEUE},
     {"a6": "b", "a7": "b"}),
    ("K8 reclaim takes no more than the claim, and only from a queue above its nominal",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4}),
           running=since(ones("a", 5), 0.0) + since(ones("b", 2), 0.0), waiting=ones("b", 2, 2)),
     ["a1", "a2", "a3", "a4", "b0", "b1", "b2", "b3"],
     {"a0": StatusCode.RECLAIMED_BY_QUEUE}, {"a0": "b"}),
    ("L1 reclaim spares jobs younger than their queue's minimum runtime",
     Cycle(queues(a={"nominal": 4, "min_runtime_s": 60}, b={"nominal": 4}),
           running=[*since(ones("a", 6), 0.0), (job("a6", "a"), 50.0), (job("a7", "a"), 90.0)],
           waiting=ones("b", 2)),
     ["a2", "a3", "a4", "a5", "a6", "a7", "b0", "b1"],
     {"a0": StatusCode.RECLAIMED_BY_QUEUE, "a1": StatusCode.RECLAIMED_BY_QUEUE},
     {"a0": "b", "a1": "b"}),
    ("L2 with every borrower too young, the lender waits for the reclaim",
     Cycle(queues(a={"nominal": 4, "min_runtime_s": 60}, b={"nominal": 4}),
           running=since(ones("a", 8), 90.0), waiting=ones("b", 1)),
     [f"a{i}" for i in range(8)], {"b0": StatusCode.WAITING_FOR_RECLAIM}, {}),
    ("K9 nothing is reclaimed for a queue at its nominal quota",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4}),
           running=since(ones("a", 4), 0.0) + since(ones("b", 4), 0.0), waiting=ones("b", 1, 4)),
     [*(f"a{i}" for i in range(4)), *(f"b{i}" for i in range(4))], {"b4": W}, {}),
    ("K10 reclaimWithinCohort Never: the lender waits for borrowers to finish",
     Cycle(queues(a={"nominal": 4}, b={"nominal": 4, "reclaim": "never"}),
           running=since(ones("a", 8), 0.0), waiting=ones("b", 1)),
     [f"a{i}" for i in range(8)], {"b0": StatusCode.WAITING_FOR_RECLAIM}, {}),
    ("K11 reclaimWithinCohort LowerPriority: a higher-priority borrower is kept",
     Cycle(queues(a={"nominal": 2, "priority": 5},
                  b={"nominal": 4, "priority": 1, "reclaim": "lower_priority"},
                  c={"nominal": 2}),
           running=since(ones("a", 4), 0.0) + since(ones("c", 4), 10.0), waiting=ones("b", 2)),
     [*(f"a{i}" for i in range(4)), "c2", "c3", "b0", "b1"],
     {"c0": StatusCode.RECLAIMED_BY_QUEUE, "c1": StatusCode.RECLAIMED_BY_QUEUE},
     {"c0": "b", "c1": "b"}),
    ("K12 reclaimWithinCohort Any: any borrower may be reclaimed",
     Cycle(queues(a={"nominal": 2, "priority": 5}, b={"nominal": 4}, c={"nominal": 2}),
           running=since(ones("a", 4), 20.0) + since(ones("c", 4), 10.0), waiting=ones("b", 2)),
     [*(f"c{i}" for i in range(4)), "a2", "a3", "b0", "b1"],
     {"a0": StatusCode.RECLAIMED_BY_QUEUE, "a1": StatusCode.RECLAIMED_BY_QUEUE},
     {"a0": "b", "a1": "b"}),
    ("P1 contended borrowed GPUs go to the higher-priority queue first",
     Cycle(queues(a={"nominal": 2}, b={"nominal": 2, "priority": 1}, c={"nominal": 4}),
           waiting=ones("a", 6) + ones("b", 6)),
     ["a0", "a1", *(f"b{i}" for i in range(6))],
     {f"a{i}": StatusCode.WAITING_FOR_FAIR_SHARE for i in range(2, 6)}, {}),
    ("F1 at equal priority, to the queue with less decayed usage per weight",
     Cycle(queues(a={"nominal": 2, "weight": 2}, b={"nominal": 2}, c={"nominal": 4}),
           waiting=ones("a", 6) + ones("b", 6), usage={"a": 3000.0, "b": 1000.0}),
     ["a0", "a1", *(f"b{i}" for i in range(6))],
     {f"a{i}": StatusCode.WAITING_FOR_FAIR_SHARE for i in range(2, 6)}, {}),
    ("F2 weight divides usage: twice the weight, twice the usage to rank even",
     Cycle(queues(a={"nominal": 2, "weight": 4}, b={"nominal": 2}, c={"nominal": 4}),
           waiting=ones("a", 6) + ones("b", 6), usage={"a": 3000.0, "b": 1000.0}),
     [*(f"a{i}" for i in range(6)), "b0", "b1"],
     {f"b{i}": W for i in range(2, 6)}, {}),
    ("T1 per-type quotas: a job takes the first type its queue has quota for",
     Cycle(queues(a={"nominal": {"a100": 2, "v100": 4}}, b={"nominal": {"a100": 2}}),
           waiting=ones("a", 7), cl=HETERO),
     [f"a{i}" for i in range(7)], {}, {}),
    ("T2 per-type quotas: no borrowing a type the queue does not list",
     Cycle(queues(a={"nominal": {"v100": 2}}, b={"nominal": {"v100": 2, "a100": 4}}),
           waiting=ones("a", 5), cl=HETERO),
     ["a0", "a1", "a2", "a3"], {"a4": W}, {}),
    ("T3 per-type quotas: reclaim frees the type the lender waits for",
     Cycle(queues(a={"nominal": {"a100": 2, "v100": 2}}, b={"nominal": {"a100": 2, "v100": 2}}),
           running=since([job(f"a{i}", "a", gpu_type="a100") for i in range(4)], 0.0),
           waiting=[job("b0", "b", 2, gpu_type="a100")], cl=HETERO),
     ["a2", "a3", "b0"],
     {"a0": StatusCode.RECLAIMED_BY_QUEUE, "a1": StatusCode.RECLAIMED_BY_QUEUE},
     {"a0": "b", "a1": "b"}),
]


@pytest.mark.parametrize(("cycle", "placed", "held", "victims"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_gate(cycle: Cycle, placed: list[str], held: dict[str, StatusCode],
              victims: dict[str, str]) -> None:
    got, gate = cycle.walk()
    assert sorted(got) == sorted(placed)
    assert {j: s.code for j, s in gate.held.items()} == held
    assert gate.reclaimed == victims
    for status in gate.held.values():
        assert status.decided_by == "queues" and "queue" in status.reason


def test_reasons_name_queues_cohorts_and_numbers() -> None:
    _, gate = Cycle(queues(a={"nominal": 4, "borrowing_limit": 1}, b={"nominal": 4}),
                    waiting=ones("a", 6)).walk()
    assert gate.held["a5"].reason == ("queue 'a' would hold 6 GPUs, over its nominal 4 + "
                                      "borrowing limit 1")
    assert gate.explain(1) == gate.held["a5"].reason  # what greedy_fill records as blocked
    _, gate = Cycle(queues(a={"nominal": 4}, b={"nominal": 4, "lending_limit": 1}),
                    waiting=ones("a", 6)).walk()
    assert gate.held["a5"].reason == ("queue 'a' would borrow 1 GPUs; cohort 'c' has 3 idle "
                                      "GPUs of quota but its lending limits let 0 of them be "
                                      "borrowed")
    _, gate = Cycle(queues(a={"nominal": 4}, b={"nominal": 4}),
                    running=since(ones("a", 8), 0.0), waiting=ones("b", 1)).walk()
    assert gate.held["a0"].reason == ("reclaimed by queue 'b': its jobs wait within its "
                                      "nominal quota, which queue 'a' had borrowed")


def test_reclaim_waits_for_the_minimum_runtime_and_says_until_when() -> None:
    cycle = Cycle(queues(a={"nominal": 4, "min_runtime_s": 60}, b={"nominal": 4}),
                  running=since(ones("a", 4), 95.0) + since(ones("a", 4, 4), 90.0),
                  waiting=[job("b0", "b", 4)], now=100.0)
    _, gate = cycle.walk()
    # Every borrower's job is younger than 60 s: nothing is preempted now, and the scheduler
    # re-plans when the first of them comes of age.
    assert gate.reclaimed == {} and gate.wakeup_at == 150.0
    assert gate.held["b0"].code is StatusCode.WAITING_FOR_RECLAIM
    assert gate.held["b0"].reason.endswith("reach their minimum runtime at 150)")
    _, gate = Cycle(cycle.config, running=cycle.running, waiting=cycle.waiting,
                    now=150.0).walk()
    assert sorted(gate.reclaimed) == ["a4", "a5", "a6", "a7"]  # of age; a0-a3 are not yet


def test_victims_least_progress_lost_breaks_a_checkpoint_tie() -> None:
    """Same last checkpoint: the smaller gang loses less, and covers a claim of one."""
    cycle = Cycle(queues(a={"nominal": 2}, b={"nominal": 6}),
                  running=[(job("wide", "a", 4), 0.0), (job("narrow", "a", 2), 0.0),
                           (job("b0", "b", 2), 0.0)],
                  waiting=[job("b1", "b", 2)])
    _, gate = cycle.walk()
    assert gate.reclaimed == {"narrow": "b"}


def test_a_minimal_set_of_victims() -> None:
    """Greedy in victim order, then back over it: a newer small job taken first is dropped
    when an older wide one, needed anyway, covers the claim alone."""
    cycle = Cycle(queues(a={"nominal": 2}, b={"nominal": 6}),
                  running=[(job("small", "a", 1), 50.0), (job("wide", "a", 4), 10.0),
                           (job("rest", "a", 1), 0.0)],
                  waiting=[job("b0", "b", 4)])
    _, gate = cycle.walk()
    assert gate.reclaimed == {"wide": "b"}


def test_running_jobs_keep_their_gpus_without_a_claim() -> None:
    """A queue that borrowed keeps what it holds until a lender asks for it back."""
    _, gate = Cycle(queues(a={"nominal": 2}, b={"nominal": 6}),
                    running=since(ones("a", 8), 0.0), waiting=[]).walk()
    assert gate.reclaimed == {} and gate.held == {}


def test_a_tenant_in_no_queue_is_outside_the_queue_rules() -> None:
    config = queues(a={"nominal": 2}, b={"nominal": 2})
    placed, gate = Cycle(config, waiting=ones("x", 6)).walk()
    assert placed == [f"x{i}" for i in range(6)] and gate.held == {}


def test_status_for_a_job_the_walk_never_reached() -> None:
    cycle = Cycle(queues(a={"nominal": 4, "borrowing_limit": 0}, b={"nominal": 4}),
                  waiting=ones("a", 5))
    cycle.order = [f"a{i}" for i in range(4)]
    _, gate = cycle.walk()
    status = gate.status_for("a4", cycle.waiting[4])
    assert status is not None and status.code is StatusCode.BORROWING_LIMIT


def test_a_queue_may_swap_its_own_jobs_in_the_policys_order() -> None:
    """The policy ranks a's waiting job before a's running one: the waiting job takes the
    queue's room, and the running job, walked after, no longer fits (the policy preempts it)."""
    cycle = Cycle(queues(cohort=None, a={"nominal": 4}),
                  running=since(ones("a", 4), 0.0), waiting=[job("short", "a", 2)])
    cycle.order = ["short", "a0", "a1", "a2", "a3"]
    placed, gate = cycle.walk()
    assert placed == ["short", "a0", "a1"]
    assert {j: s.code for j, s in gate.held.items()} == {
        "a2": StatusCode.WAITING_FOR_QUEUE_QUOTA, "a3": StatusCode.WAITING_FOR_QUEUE_QUOTA}
    assert gate.reclaimed == {}


def test_another_queue_never_takes_a_running_jobs_quota_by_walking_first() -> None:
    """b's borrowing job walked before a's running jobs: a's running jobs still count, so b
    waits (a borrower is not displaced by another borrower)."""
    cycle = Cycle(queues(a={"nominal": 2}, b={"nominal": 2}, c={"nominal": 4}),
                  running=since(ones("a", 6), 0.0), waiting=ones("b", 4))
    cycle.order = ["b0", "b1", "b2", "b3"] + [f"a{i}" for i in range(6)]
    placed, gate = cycle.walk()
    assert sorted(placed) == ["a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1"]
    assert {j: s.code for j, s in gate.held.items()} == {"b2": W, "b3": W}
