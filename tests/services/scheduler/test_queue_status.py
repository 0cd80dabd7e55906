"""The queues' status (`loom queues`) as a pure function of the scheduler's state: quotas, use,
borrowing, lending (split between lenders), waiting jobs and why, rank; when it is published;
and that neither asking for it nor publishing it changes a decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import policies
from policies.mechanisms.fairshare import accrue
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec, SubmitJob
from schemas.queue_status import QueueState, QueueStatus
from schemas.queues import ANY_TYPE
from schemas.status import StatusCode
from schemas.tenants import TenantsConfig, parse_tenants
from services.runtime.effects import Effect, Publish
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.queue_status import apportion, split
from tests.builders import cluster, deliver
from tests.policies.mechanisms.queue_fixtures import job, queue_file, queues

HETERO = ClusterSpec.heterogeneous({"a100": 4, "v100": 4}, 4)


def scheduler(tenants: TenantsConfig | None, cl: ClusterSpec | None = None,
              every: float | None = None, policy: str = "fifo") -> SchedulerCore:
    return SchedulerCore(cl or cluster(2, 4), policies.make(policy),
                         SchedulerConfig(tenants=tenants, queue_status_every_s=every))


def run(sched: SchedulerCore, jobs: list[JobSpec], now: float) -> list[Effect]:
    """Submit `jobs` at `now`, then run the cycle they ask for."""
    for spec in jobs:
        deliver(sched, SubmitJob.from_spec(spec), now)
    return sched.on_timer("cycle", now)


# (GPU type, nominal, used, borrowed, lent) of each quota; running; pending (jobs, GPUs);
# {code: jobs}; rank in its cohort.
Quota = tuple[str, int, int, int, int]


@dataclass
class Want:
    quotas: list[Quota]
    running: int = 0
    pending: tuple[int, int] = (0, 0)
    waiting: dict[StatusCode, int] = field(default_factory=dict)
    rank: int | None = None


def check(row: QueueState, want: Want) -> None:
    got = [(q.gpu_type, q.nominal, q.used, q.borrowed, q.lent) for q in row.quotas]
    assert got == want.quotas, row.name
    assert (row.running_jobs, (row.pending_jobs, row.pending_gpus)) == (want.running,
                                                                        want.pending), row.name
    assert {w.code: w.jobs for w in row.waiting} == want.waiting, row.name
    assert row.rank == want.rank, row.name


def ones(queue: str, n: int, gpus: int = 1, gpu_type: str | None = None) -> list[JobSpec]:
    return [job(f"{queue}{i}", queue, gpus, gpu_type) for i in range(n)]


CASES: list[Any] = [
    pytest.param(queues(a={"nominal": 4}, b={"nominal": 4}), cluster(2, 4), [], {
        "a": Want([(ANY_TYPE, 4, 0, 0, 0)], rank=1),
        "b": Want([(ANY_TYPE, 4, 0, 0, 0)], rank=2)}, id="idle"),
    pytest.param(queues(a={"nominal": 4, "borrowing_limit": 2}, b={"nominal": 4}),
                 cluster(2, 4), ones("a", 4, gpus=2), {
        "a": Want([(ANY_TYPE, 4, 6, 2, 0)], running=3, pending=(1, 2),
                  waiting={StatusCode.BORROWING_LIMIT: 1}, rank=2),
        "b": Want([(ANY_TYPE, 4, 0, 0, 2)], rank=1)}, id="borrowing"),
    pytest.param(queues(a={"nominal": 4}, b={"nominal": 4, "lending_limit": 1}),
                 cluster(2, 4), ones("a", 6), {
        "a": Want([(ANY_TYPE, 4, 5, 1, 0)], running=5, pending=(1, 1),
                  waiting={StatusCode.LENDING_LIMIT: 1}, rank=2),
        "b": Want([(ANY_TYPE, 4, 0, 0, 1)], rank=1)}, id="lending-limit"),
    # a borrows 4: b has 4 idle to lend and c 2, so b lends 4 * 4/6 -> 3 (largest remainder)
    # and c 1.
    pytest.param(queues(a={"nominal": 2}, b={"nominal": 4}, c={"nominal": 2}), cluster(2, 4),
                 ones("a", 6), {
        "a": Want([(ANY_TYPE, 2, 6, 4, 0)], running=6, rank=3),
        "b": Want([(ANY_TYPE, 4, 0, 0, 3)], rank=1),
        "c": Want([(ANY_TYPE, 2, 0, 0, 1)], rank=2)}, id="lenders-share"),
    pytest.param(queues(a={"nominal": {"a100": 2, "v100": 2}},
                        b={"nominal": {"a100": 2, "v100": 2}}), HETERO,
                 ones("a", 3, gpu_type="a100"), {
        "a": Want([("a100", 2, 3, 1, 0), ("v100", 2, 0, 0, 0)], running=3, rank=2),
        "b": Want([("a100", 2, 0, 0, 1), ("v100", 2, 0, 0, 0)], rank=1)}, id="typed"),
    pytest.param(queues(cohort=None, a={"nominal": 2}), cluster(2, 4), ones("a", 3), {
        "a": Want([(ANY_TYPE, 2, 2, 0, 0)], running=2, pending=(1, 1),
                  waiting={StatusCode.WAITING_FOR_QUEUE_QUOTA: 1})}, id="no-cohort"),
]


@pytest.mark.parametrize(("tenants", "cl", "jobs", "want"), CASES)
def test_queue_status_after_a_cycle(tenants: TenantsConfig, cl: ClusterSpec,
                                    jobs: list[JobSpec], want: dict[str, Want]) -> None:
    sched = scheduler(tenants, cl)
    run(sched, jobs, 0.0)
    status = sched.queues(100.0)  # usage accrued since the cycle: borrowers rank last
    assert status.tenants_file and status.configured
    assert [q.name for q in status.queues] == list(want)  # the file's order
    for row in status.queues:
        check(row, want[row.name])
    # Borrowing and lending balance in every cohort and resource.
    for r in {q.gpu_type for row in status.queues for q in row.quotas}:
        quotas = [q for row in status.queues if row.cohort is not None for q in row.quotas
                  if q.gpu_type == r]
        assert sum(q.borrowed for q in quotas) == sum(q.lent for q in quotas)


def test_a_reclaim_shows_as_its_victims_waiting_and_the_lender_holding_its_quota() -> None:
    sched = scheduler(queues(a={"nominal": 4}, b={"nominal": 4}))
    run(sched, ones("a", 8), 0.0)
    assert sched.queues(0.0).queues[0].quotas[0].borrowed == 4
    run(sched, [job("b0", "b", 2)], 10.0)
    a, b = sched.queues(20.0).queues
    check(a, Want([(ANY_TYPE, 4, 6, 2, 0)], running=6, pending=(2, 2),
                  waiting={StatusCode.RECLAIMED_BY_QUEUE: 2}, rank=2))
    check(b, Want([(ANY_TYPE, 4, 2, 0, 2)], running=1, rank=1))
    [why] = a.waiting
    assert why.job_id == "a0" and why.reason.startswith("reclaimed by queue 'b'")


def test_decayed_usage_is_brought_up_to_the_time_asked() -> None:
    half_life = 1000.0
    sched = scheduler(queues(half_life_s=half_life, a={"nominal": 4}, b={"nominal": 4}))
    run(sched, ones("a", 6), 0.0)
    a, b = sched.queues(250.0).queues
    assert a.usage_gpu_s == pytest.approx(accrue(0.0, 6, 250.0, half_life))
    assert (b.usage_gpu_s, b.rank, a.rank) == (0.0, 1, 2)
    assert b.share_factor == 1.0 and 0.0 < a.share_factor < 1.0
    assert sched.queues(0.0).queues[0].usage_gpu_s == 0.0  # asking changed nothing


def test_jobs_of_tenants_in_no_queue_are_counted_apart() -> None:
    sched = scheduler(queues(a={"nominal": 4}))
    run(sched, [job("z0", "zed", 3), job("z1", "zed", 8), job("a0", "a", 1)], 0.0)
    status = sched.queues(0.0)
    assert status.unqueued is not None
    assert (status.unqueued.running_jobs, status.unqueued.used_gpus,
            status.unqueued.pending_jobs) == (1, 3, 1)
    check(status.queues[0], Want([(ANY_TYPE, 4, 1, 0, 0)], running=1, rank=1))


@pytest.mark.parametrize(("tenants", "file"), [
    (None, False),
    (parse_tenants({"tenants": {"nlp": {"max_gpus": 4}}}, "t.toml"), True),
], ids=["no-tenants-file", "no-queues"])
def test_without_queues_the_status_says_why(tenants: TenantsConfig | None, file: bool) -> None:
    sched = scheduler(tenants, every=0.0)
    effects = run(sched, [job("a0", "nlp")], 0.0)
    status = sched.queues(0.0)
    assert (status.configured, status.tenants_file, status.queues) == (False, file, ())
    assert not published(effects)  # nothing to publish


def published(effects: list[Effect]) -> list[QueueStatus]:
    return [e.body for e in effects if isinstance(e, Publish) and isinstance(e.body, QueueStatus)]


def test_published_after_a_cycle_when_it_changed_or_is_old() -> None:
    # a and b hold the same all along: equal usage, so their ranks stay as they are.
    sched = scheduler(queues(a={"nominal": 4}, b={"nominal": 4}), every=60.0)
    first = published(run(sched, ones("a", 2) + ones("b", 2), 0.0))
    assert [[q.running_jobs for q in s.queues] for s in first] == [[2, 2]]
    assert first[0] == sched.queues(0.0)  # what a request at that instant answers
    assert published(sched.on_timer("cycle", 10.0)) == []  # nothing moved: not again
    moved = published(run(sched, [job("a9", "a"), job("b9", "b")], 20.0))
    assert [[q.running_jobs for q in s.queues] for s in moved] == [[3, 3]]
    assert published(sched.on_timer("cycle", 79.0)) == []
    assert [s.at for s in published(sched.on_timer("cycle", 80.0))] == [80.0]  # usage aged


def test_not_published_unless_configured() -> None:
    sched = scheduler(queues(a={"nominal": 4}))
    assert published(run(sched, ones("a", 2), 0.0)) == []


def test_publishing_and_asking_change_no_decision() -> None:
    """Two schedulers fed the same inputs, one publishing and asked between its cycles: the
    same decisions, every one (srtf preempts; b's arrival reclaims)."""
    def decisions(every: float | None, ask: bool) -> list[Any]:
        sched = scheduler(queues(a={"nominal": 4, "min_runtime_s": 5}, b={"nominal": 4}),
                          every=every, policy="srtf")
        out = []
        script = [(0.0, ones("a", 8)), (3.0, [job("b0", "b", 2)]), (5.0, []),
                  (9.0, [job("b1", "b", 1), job("a9", "a", 1)])]
        for now, jobs in script:
            if ask:
                sched.queues(now)
            effects = run(sched, jobs, now) + sched.on_timer("wakeup", now)
            out += [(type(e).__name__, getattr(e, "body", e)) for e in effects
                    if not (isinstance(e, Publish) and isinstance(e.body, QueueStatus))]
        return out

    assert decisions(0.0, ask=True) == decisions(None, ask=False)


@pytest.mark.parametrize(("total", "weights", "want"), [
    (0, {"a": 3, "b": 1}, {"a": 0, "b": 0}),
    (4, {"a": 4, "b": 2}, {"a": 3, "b": 1}),
    (3, {"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1, "c": 1}),
    (2, {"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1, "c": 0}),  # ties: the earlier key
    (5, {"a": 5, "b": 0}, {"a": 5, "b": 0}),
])
def test_apportion(total: int, weights: dict[str, int], want: dict[str, int]) -> None:
    got = apportion(total, weights)
    assert got == want and sum(got.values()) == total
    assert all(got[k] <= weights[k] for k in weights)


def test_a_status_of_many_queues_is_published_in_parts() -> None:
    specs = {f"q{i}": {"nominal": 1} for i in range(5)}
    sched = scheduler(queue_file(specs))
    run(sched, [], 0.0)
    status = sched.queues(0.0)
    parts = split(status, per=2)
    assert [(p.part, p.parts, [q.name for q in p.queues]) for p in parts] == [
        (0, 3, ["q0", "q1"]), (1, 3, ["q2", "q3"]), (2, 3, ["q4"])]
    assert parts[0].cohorts == status.cohorts and parts[1].cohorts == ()
    assert split(status) == [status]
