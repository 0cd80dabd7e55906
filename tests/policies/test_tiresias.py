"""Tiresias' discretised LAS (las: attained time, tiresias: attained GPU-time), algorithms.md §4a.

Queue limits 3250 s and 7200 s; Q0 is walked first; demotion moves a running job one queue per
cycle; the re-plan instant is `now + ceil(limit / gpus) − attained` (time-based: limit − attained).
The queue of a job is read from the policy's key, whose first element is the queue by contract
(policies/tiresias.py docstring: "(queue, 0, rank) ... (queue, 1, seq)").
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import pytest

import policies
from domain.placement import CyclePlacement
from policies.base import JobView, RunningJobs, Snapshot
from schemas.job import JobSpec
from schemas.status import StatusCode
from services.scheduler.in_place import open_cycle
from tests.builders import ReadViews, cluster, make_job, view
from tests.policies.driver import Driver, running_after

MLFQ = ("las", "tiresias")
LONG = 100_000  # seconds: longer than any scenario here


def J(job_id: str, gpus: int = 1, seconds: float = LONG, submit: float = 0.0) -> JobSpec:
    return make_job(job_id).gpus(gpus).runs_for(seconds).submit(submit).build()


def queue_of(d: Driver, job_id: str) -> int:
    key = d.policy.key(d.jobs[job_id].view())  # type: ignore[attr-defined]
    return int(key[0])


@pytest.mark.parametrize("policy", MLFQ)
def test_new_jobs_enter_queue_0(policy: str) -> None:
    d = Driver.of(policy, cluster(1, 4)).add(J("a", 4), J("b", 2), J("c", 1))
    assert [queue_of(d, j) for j in "abc"] == [0, 0, 0]
    d.cycle()
    assert d.running == {"a"}
    assert [queue_of(d, j) for j in "abc"] == [0, 0, 0]


@pytest.mark.parametrize(
    ("policy", "gpus", "cycles", "queues"),
    [
        # las counts seconds of service, whatever the GPU count.
        pytest.param("las", 1, [3249, 3250], [0, 1], id="las-1gpu-at-3250s"),
        pytest.param("las", 4, [812.5, 3249, 3250], [0, 0, 1], id="las-4gpus-still-3250s"),
        pytest.param("las", 1, [3250, 7199, 7200], [1, 1, 2], id="las-q2-at-7200s"),
        pytest.param("las", 1, [3250, 7200, 20_000], [1, 2, 2], id="las-q2-is-last"),
        # tiresias counts GPU-seconds: 4 GPUs reach 3250 GPU-s after 812.5 s.
        pytest.param("tiresias", 1, [3249, 3250], [0, 1], id="tiresias-1gpu-at-3250"),
        pytest.param("tiresias", 4, [812, 812.5], [0, 1], id="tiresias-4gpus-at-812.5s"),
        pytest.param("tiresias", 4, [813, 1799, 1800], [1, 1, 2], id="tiresias-4gpus-q2-at-1800s"),
        pytest.param("tiresias", 8, [406, 406.25, 900], [0, 1, 2], id="tiresias-8gpus"),
    ],
)
def test_running_job_is_demoted_when_attained_service_reaches_the_limit(
    policy: str, gpus: int, cycles: list[float], queues: list[int]
) -> None:
    d = Driver.of(policy, cluster(1, 8)).add(J("a", gpus))
    d.cycle(0.0)
    got = []
    for t in cycles:
        d.cycle(t)
        got.append(queue_of(d, "a"))
    assert got == queues


@pytest.mark.parametrize(
    ("policy", "gpus", "attained"),
    [pytest.param("las", 1, 8000, id="las-8000s"),
     pytest.param("tiresias", 2, 4000, id="tiresias-2x4000s")],
)
def test_demotion_is_one_level_per_cycle(policy: str, gpus: int, attained: float) -> None:
    d = Driver.of(policy, cluster(1, 8)).add(J("a", gpus))
    d.cycle(0.0)
    d.advance(attained)  # past both limits without a cycle in between
    queues = []
    for _ in range(3):
        d.cycle()
        queues.append(queue_of(d, "a"))
    assert queues == [1, 2, 2]


@pytest.mark.parametrize(
    ("policy", "gpus", "arrival", "runs"),
    [
        # At 3249 s the running job is still in Q0 and, having run, comes first.
        pytest.param("las", 1, 3249, "old", id="las-before-limit-old-keeps"),
        pytest.param("las", 1, 3250, "new", id="las-at-limit-new-q0-job-wins"),
        # 2 GPUs: 3250 GPU-s after 1625 s.
        pytest.param("tiresias", 2, 1624, "old", id="tiresias-before-limit"),
        pytest.param("tiresias", 2, 1625, "new", id="tiresias-at-limit"),
        pytest.param("las", 2, 1625, "old", id="las-same-time-not-demoted"),
    ],
)
def test_queue_0_outranks_queue_1(policy: str, gpus: int, arrival: float, runs: str) -> None:
    d = Driver.of(policy, cluster(1, gpus)).add(J("old", gpus))
    d.cycle(0.0)
    d.advance(arrival)
    d.add(J("new", gpus, submit=arrival))
    plan = d.cycle()
    assert set(plan.run) == {runs}
    waiting = "new" if runs == "old" else "old"
    assert d.waiting_order() == [waiting]
    assert d.status(waiting).code is StatusCode.WAITING_FOR_PRIORITY


@pytest.mark.parametrize("policy", MLFQ)
def test_within_a_queue_jobs_that_ran_last_cycle_come_first(policy: str) -> None:
    # 2 GPUs. t=0 (all Q0, arrival order r, w, a): r runs, w (2) does not fit, a fills the gap.
    d = Driver.of(policy, cluster(1, 2)).add(J("r", 1, 10), J("w", 2), J("a", 1))
    assert set(d.cycle(0.0).run) == {"r", "a"}
    # t=10: r is done. w arrived before a, but a ran last cycle, so a stays and w still waits.
    plan = d.cycle(10.0)
    assert set(plan.run) == {"a"}
    assert d.waiting_order() == ["w"]


@dataclass(frozen=True)
class Step:
    at: float
    add: tuple[JobSpec, ...] = ()
    running: str | None = None  # the one job on the single GPU


# One GPU, 1-GPU jobs (GPU-time = time, so las and tiresias agree).
PREFIX = [
    Step(0, (J("x"), J("w")), "x"),
    Step(3250, (), "w"),  # x demoted to Q1 (back); w is still in Q0
]


@pytest.mark.parametrize("policy", MLFQ)
@pytest.mark.parametrize(
    ("steps", "order"),
    [
        # w demoted at 6500 and preempted at once by the new Q0 job n: it goes *behind* x,
        # which waits in Q1 since 3250.
        pytest.param([*PREFIX, Step(6500, (J("n", seconds=50),), "n")], ["x", "w"],
                     id="demoted-and-preempted-goes-behind"),
        # At 6500 w is demoted and x (waiting in Q1 since 3250) runs. At 6600 x, which ran last
        # cycle and is not demoted, is preempted by n: it goes *in front of* w.
        pytest.param([*PREFIX, Step(6500, (), "x"), Step(6600, (J("n", seconds=50),), "n")],
                     ["x", "w"], id="preempted-without-demotion-goes-in-front"),
    ],
)
def test_where_a_preempted_job_reenters_its_queue(
    policy: str, steps: list[Step], order: list[str]
) -> None:
    d = Driver.of(policy, cluster(1, 1))
    for step in steps:
        d.advance(step.at)
        d.add(*step.add)
        plan = d.cycle()
        assert list(plan.run) == [step.running], f"t={step.at}"
    assert d.waiting_order() == order
    assert [queue_of(d, j) for j in order] == [1, 1]
    # When n finishes, the head of Q1 runs.
    d.cycle(d.now + 50)
    assert d.running == {order[0]}


@pytest.mark.parametrize(
    ("policy", "node_gpus", "steps", "wakeup"),
    [
        # las: now + 3250 − attained, whatever the GPU count.
        pytest.param("las", 4, [(0, (J("a", 1),))], 3250, id="las-1gpu"),
        pytest.param("las", 4, [(0, (J("a", 4),))], 3250, id="las-4gpus"),
        pytest.param("las", 4, [(100, (J("a", 1),))], 3350, id="las-started-at-100"),
        pytest.param("las", 4, [(0, (J("a", 1),)), (3250, ())], 7200, id="las-q1-next-7200"),
        pytest.param("las", 4, [(0, (J("a", 1),)), (3250, ()), (7200, ())], None,
                     id="las-q2-no-more-demotions"),
        # a: 3250 − 1000 left at t=1000 → 3250; b: 1000 + 3250 = 4250.
        pytest.param("las", 8, [(0, (J("a", 2),)), (1000, (J("b", 4),))], 3250,
                     id="las-earliest-of-two-running"),
        # tiresias: now + ceil(limit / gpus) − attained.
        pytest.param("tiresias", 4, [(0, (J("a", 1),))], 3250, id="tiresias-1gpu"),
        pytest.param("tiresias", 4, [(0, (J("a", 3),))], 1084, id="tiresias-3gpus-ceil-1083.3"),
        pytest.param("tiresias", 4, [(0, (J("a", 4),))], 813, id="tiresias-4gpus-ceil-812.5"),
        pytest.param("tiresias", 4, [(0, (J("a", 4),)), (500, ())], 813,
                     id="tiresias-unchanged-mid-run"),
        pytest.param("tiresias", 4, [(0, (J("a", 4),)), (813, ())], 1800,
                     id="tiresias-q1-ceil-7200/4"),
        # a: ceil(3250 / 2) = 1625, b: ceil(3250 / 4) = 813; both run on 8 GPUs.
        pytest.param("tiresias", 8, [(0, (J("a", 2), J("b", 4)))], 813,
                     id="tiresias-earliest-of-two-running"),
        # b (4 GPUs) cannot start beside a (2 of 4 GPUs); were it counted it would say 813.
        pytest.param("tiresias", 4, [(0, (J("a", 2), J("b", 4)))], 1625,
                     id="waiting-jobs-do-not-count"),
        # a (4 GPUs) is demoted at 813 and preempted by b: only b's 813 + 813 counts.
        pytest.param("tiresias", 4, [(0, (J("a", 4),)), (813, (J("b", 4, 200),))], 1626,
                     id="preempted-job-does-not-count"),
        # b done at 1013; a resumes with 813 s attained: 1013 + 1800 − 813 = 2000.
        pytest.param("tiresias", 4,
                     [(0, (J("a", 4),)), (813, (J("b", 4, 200),)), (1013, ())], 2000,
                     id="resumed-job-counts-its-attained-service"),
    ],
)
def test_wakeup_is_the_next_demotion_instant(
    policy: str, node_gpus: int, steps: list[tuple[float, tuple[JobSpec, ...]]],
    wakeup: float | None,
) -> None:
    d = Driver.of(policy, cluster(1, node_gpus))
    for at, add in steps:
        d.advance(at)
        d.add(*add)
        plan = d.cycle()
    assert plan.wakeup_at == wakeup


@pytest.mark.parametrize(
    ("policy", "runs", "code"),
    [
        pytest.param("tiresias", True, None, id="tiresias-counts-gpus"),
        pytest.param("las", True, None, id="las-counts-gpus"),
        pytest.param("fifo", False, StatusCode.WAITING_FOR_CONSOLIDATED_GPUS,
                     id="fifo-needs-one-node"),
    ],
)
def test_placement_is_gpu_counting(policy: str, runs: bool, code: StatusCode | None) -> None:
    # 2 × 4 GPUs. t=0, in arrival order: a → n0:0-1, s → n0:2-3 (tightest), c → n1:0-1,
    # d → n1:2-3. At t=10 s and c are done: 2 + 2 free GPUs on different nodes.
    d = Driver.of(policy, cluster(2, 4)).add(
        J("a", 2, submit=0), J("s", 2, 10, 1), J("c", 2, 10, 2), J("d", 2, submit=3))
    assert d.cycle(0.0).run == {"a": (("n0", (0, 1)),), "s": (("n0", (2, 3)),),
                                "c": (("n1", (0, 1)),), "d": (("n1", (2, 3)),)}
    d.advance(10.0)
    d.add(J("e", 4, submit=10))
    plan = d.cycle()
    assert plan.run["a"] == (("n0", (0, 1)),) and plan.run["d"] == (("n1", (2, 3)),)
    if runs:
        assert sorted(plan.run["e"]) == [("n0", (2, 3)), ("n1", (0, 1))]
    else:
        assert "e" not in plan.run
        assert d.status("e").code is code


@pytest.mark.parametrize("policy", MLFQ)
def test_no_head_of_line_blocking(policy: str) -> None:
    d = Driver.of(policy, cluster(1, 4)).add(J("r", 2), J("big", 4), J("small", 2))
    plan = d.cycle()
    assert set(plan.run) == {"r", "small"}
    st = d.status("big")
    assert st.queue_position == 1 and st.code is StatusCode.WAITING_FOR_PRIORITY
    assert st.decided_by == policy


def _snapshot(views: dict[str, JobView], running: list[str], now: float,
              irregular: frozenset[str] = frozenset(), attained: bool = False) -> Snapshot:
    """A cycle's snapshot as the scheduler makes it where many jobs run: running jobs'
    views made when read, their specs read without (and their attained times, if
    `attained`)."""
    specs = {j: dict.__getitem__(views, j).spec for j in running}
    held = {j: (specs[j], dict.__getitem__(views, j).attained_s) for j in running}
    made = RunningJobs(dict.fromkeys(running).keys(),
                       lambda: tuple(views[j] for j in running), frozenset(),
                       lambda ids: [j for j in running if j in set(ids)], irregular,
                       specs.get, attained_of=held.get if attained else None)
    return Snapshot(now, cluster(1, 8), MappingProxyType(views), made)


@pytest.mark.parametrize(("c_gpus", "irregular", "read", "runs"), [
    pytest.param(2, frozenset(), set(), "abc", id="fits-beside-both-neither-read"),
    pytest.param(4, frozenset(), set(), "ac", id="displaces-b-requeued-by-its-spec-none-read"),
    pytest.param(4, frozenset({"a"}), {"a", "b"}, "ac", id="a-job-ahead-sharing-gpus-walks-all"),
])
def test_a_full_walk_keeps_the_jobs_ahead_of_every_waiting_one_without_reading_them(
        c_gpus: int, irregular: frozenset[str], read: set[str], runs: str) -> None:
    """a (1 GPU, queue 0) and b (4 GPUs, queue 1: it arrives with 4,000 s of service) run on
    8 GPUs; c enters queue 0, behind a and ahead of b, and takes free GPUs or displaces
    b. The walk gives a its GPUs back without reading it (unless a may not simply get them
    back), re-places or requeues b from its spec, and the ranks left order a before c before
    b, as numbering the walk from 0 would."""
    a, b, c = J("a", 1), J("b", 4), J("c", c_gpus)
    policy = policies.make("tiresias")
    fit = CyclePlacement(cluster(1, 8), "count", {})
    first = {"a": view(a), "b": view(b, attained=4000)}
    for v in first.values():
        policy.job_added(v)
    started = policy.plan(_snapshot(first, [], 0.0), fit).run
    assert set(started) == {"a", "b"}
    later = {"a": view(a, True, attained=100), "b": view(b, True, attained=4100),
             "c": view(c)}
    for jid in started:
        policy.job_running(later[jid])
        fit.bind(jid, started[jid])
    fit.next_cycle()
    policy.job_added(later["c"])
    views = ReadViews(later)
    plan = policy.plan(_snapshot(views, ["a", "b"], 100.0, irregular), fit)
    after = running_after(plan, started)
    assert set(after) == set(runs) and after["a"] == started["a"]
    assert views.read - {"c"} == read
    assert policy.key(later["a"]) < policy.key(later["c"]) < policy.key(later["b"])


@pytest.mark.parametrize(("attained", "read"), [
    pytest.param(False, {"a", "b", "c"}, id="crossings-predicted-from-views"),
    pytest.param(True, {"c"}, id="crossings-predicted-from-attained-times-no-running-view"),
])
def test_a_job_demoted_while_kept_ahead_is_ranked_anew(attained: bool, read: set[str]) -> None:
    """a (1 GPU) and b (4 GPUs) run on 8 GPUs and both cross a queue limit now: a drops to
    queue 1, b to queue 2, behind c (4 GPUs, waiting in queue 2 since before). c ranks ahead
    of b and finds no room beside it, so the cycle walks in full, keeping a ahead of c
    unread; c displaces b. a, demoted while kept, is ranked anew as a running job of queue 1
    (its key no longer that of a job sent to the back of a queue), as the walk over every
    job would rank it. Where the snapshot gives running jobs' attained times, their
    crossings are found and predicted without their views, alike."""
    a, b, c = J("a", 1), J("b", 4), J("c", 4)
    policy = policies.make("tiresias")
    placement = CyclePlacement(cluster(1, 8), "count", {})
    first = {"a": view(a), "b": view(b, attained=1000)}  # b enters queue 1 (4,000 GPU-s)
    for v in first.values():
        policy.job_added(v)
    started = policy.plan(_snapshot(first, [], 0.0), placement).run
    assert set(started) == {"a", "b"}
    # a: 3,300 GPU-s (queue 0's limit is 3,250); b: 7,400 (queue 1's is 7,200); c: 8,000.
    later = {"a": view(a, True, attained=3300), "b": view(b, True, attained=1850),
             "c": view(c, attained=2000)}
    for jid in started:
        policy.job_running(later[jid])
        placement.bind(jid, started[jid])
    policy.job_added(later["c"])
    views = ReadViews(later)
    snap, fit, plan = open_cycle(policy, _snapshot(views, ["a", "b"], 3300.0,
                                                   attained=attained), True,
                                 lambda in_place: _opened(placement, in_place))
    assert plan is None and not snap.in_place  # planned in full
    plan = policy.plan(snap, fit)
    assert views.read == read
    assert set(running_after(plan, started)) == {"a", "c"}
    assert [queue_of_view(policy, later[j]) for j in "abc"] == [1, 2, 2]
    assert policy.key(later["a"])[1] == 0  # ranked as running, not queued at the back
    assert policy.key(later["a"]) < policy.key(later["c"]) < policy.key(later["b"])


def queue_of_view(policy: policies.Policy, job: JobView) -> int:
    return int(policy.key(job)[0])  # type: ignore[attr-defined]


def _opened(placement: CyclePlacement, in_place: bool) -> CyclePlacement:
    placement.next_cycle(in_place=in_place)
    return placement
