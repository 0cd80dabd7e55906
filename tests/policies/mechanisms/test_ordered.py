"""Key-ordered policies (fifo, srtf, srsf) driven cycle by cycle, as the scheduler drives them.

Keys, from the policy definitions (Muri §1a): fifo = submit time; srtf = remaining time;
srsf = remaining time × GPUs; ties by submit time, then job id. Lower runs first.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
from domain.placement import CyclePlacement
from policies.base import JobView, RunningJobs, Snapshot
from policies.mechanisms.ordered import OrderedPolicy
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.status import StatusCode
from tests.builders import ReadViews, cluster, make_job, view
from tests.policies.driver import Driver, running_after

ORDERED = ("fifo", "srtf", "srsf")


def J(job_id: str, gpus: int, seconds: float, submit: float = 0.0) -> JobSpec:
    return make_job(job_id).gpus(gpus).runs_for(seconds).submit(submit).build()


# --------------------------------------------------------------------------------------------
# ordering
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("policy", "jobs", "runs", "waiting"),
    [
        # One node of 4 GPUs: with 3–4-GPU jobs only one runs; the rest wait in key order.
        pytest.param("fifo", [J("a", 4, 10, 5), J("b", 4, 300, 0), J("c", 4, 20, 3)],
                     {"b"}, ["c", "a"], id="fifo-by-submit-time"),
        pytest.param("fifo", [J("c", 4, 5), J("a", 4, 50), J("b", 4, 1)],
                     {"a"}, ["b", "c"], id="fifo-same-submit-by-id"),
        pytest.param("fifo", [J("a", 4, 100, 0), J("b", 4, 30, 1), J("c", 4, 60, 2)],
                     {"a"}, ["b", "c"], id="fifo-ignores-duration"),
        pytest.param("srtf", [J("a", 4, 100, 0), J("b", 4, 30, 1), J("c", 4, 60, 2)],
                     {"b"}, ["c", "a"], id="srtf-by-remaining-time"),
        pytest.param("srtf", [J("a", 4, 50, 2), J("c", 4, 50, 1), J("b", 4, 50, 1),
                              J("d", 4, 10, 9)],
                     {"d"}, ["b", "c", "a"], id="srtf-ties-by-submit-then-id"),
        # GPU-time: a = 3×100 = 300, b = 4×80 = 320, c = 4×70 = 280.
        pytest.param("srsf", [J("a", 3, 100), J("b", 4, 80), J("c", 4, 70)],
                     {"c"}, ["a", "b"], id="srsf-by-gpu-time"),
        pytest.param("srtf", [J("a", 3, 100), J("b", 4, 80), J("c", 4, 70)],
                     {"c"}, ["b", "a"], id="srtf-same-jobs-by-time"),
        # GPU-time ties: a = 2×100, b = 4×50, c = 1×200 (all 200) → submit time, then id.
        pytest.param("srsf", [J("a", 2, 100, 1), J("b", 4, 50, 1), J("c", 1, 200, 0),
                              J("z", 4, 10, 5)],
                     {"z"}, ["c", "a", "b"], id="srsf-ties-by-submit-then-id"),
    ],
)
def test_jobs_run_and_wait_in_key_order(
    policy: str, jobs: list[JobSpec], runs: set[str], waiting: list[str]
) -> None:
    d = Driver.of(policy, cluster(1, 4)).add(*jobs)
    plan = d.cycle()
    assert set(plan.run) == runs
    assert d.waiting_order() == waiting


@pytest.mark.parametrize("policy", ORDERED)
def test_waiting_status_has_position_reason_and_decider(policy: str) -> None:
    d = Driver.of(policy, cluster(1, 4)).add(
        J("a", 4, 10, 0), J("b", 4, 20, 1), J("c", 4, 30, 2))
    d.cycle()
    assert d.running == {"a"}
    for position, jid in enumerate(["b", "c"], start=1):
        st = d.status(jid)
        assert st.code is StatusCode.WAITING_FOR_PRIORITY
        assert st.reason
        assert st.decided_by == policy
        assert st.queue_position == position


# --------------------------------------------------------------------------------------------
# fragmentation and head-of-line blocking
# --------------------------------------------------------------------------------------------

# Keys agree for all three policies: r1 < r2 < b < s (submit, time and GPU-time all increase,
# and stay so after s runs 10 s: srsf s = 990 > b = 2 × 400).
FRAGMENTING = [J("r1", 3, 100, 0), J("r2", 3, 110, 1), J("b", 2, 400, 2), J("s", 1, 1000, 3)]


@pytest.mark.parametrize("policy", ORDERED)
def test_job_blocked_by_fragmentation_gets_the_fitters_explanation(policy: str) -> None:
    # 2 × 4 GPUs: r1 → n0, r2 → n1 (n0 has 1 left), so 2 GPUs are free but 1 per node.
    d = Driver.of(policy, cluster(2, 4)).add(*FRAGMENTING[:3])
    plan = d.cycle()
    assert plan.run == {"r1": (("n0", (0, 1, 2)),), "r2": (("n1", (0, 1, 2)),)}
    st = d.status("b")
    assert st.code is StatusCode.WAITING_FOR_CONSOLIDATED_GPUS
    assert d.fit is not None and d.fit.free_gpus == 2
    assert st.reason == d.fit.explain(2)
    assert "2 free but the largest block in one node is 1" in st.reason
    assert st.queue_position == 1
    assert st.decided_by == policy


@pytest.mark.parametrize("policy", ORDERED)
def test_no_head_of_line_blocking_behind_a_fragmented_job(policy: str) -> None:
    d = Driver.of(policy, cluster(2, 4)).add(*FRAGMENTING)
    plan = d.cycle()
    # s (1 GPU) runs although b, ranked ahead of it, does not fit.
    assert set(plan.run) == {"r1", "r2", "s"}
    assert d.waiting_order() == ["b"]
    st = d.status("b")
    assert st.code is StatusCode.WAITING_FOR_CONSOLIDATED_GPUS
    assert "largest block in one node is 1" in st.reason
    # Next cycle (10 s later) nothing changes: the same jobs keep the same GPUs.
    again = d.cycle(10.0)
    assert again.run == plan.run
    assert d.status("b").code is StatusCode.WAITING_FOR_CONSOLIDATED_GPUS


@pytest.mark.parametrize("policy", ORDERED)
def test_every_job_blocked_by_fragmentation_says_so(policy: str) -> None:
    jobs = [*FRAGMENTING[:3], J("b2", 2, 600, 2.5)]
    d = Driver.of(policy, cluster(2, 4)).add(*jobs)
    d.cycle()
    assert d.status("b").code is StatusCode.WAITING_FOR_CONSOLIDATED_GPUS
    assert d.status("b2").code is StatusCode.WAITING_FOR_CONSOLIDATED_GPUS


@pytest.mark.parametrize("policy", ORDERED)
def test_small_job_behind_a_big_one_that_does_not_fit_runs(policy: str) -> None:
    # Keys r < big < small for every policy (srsf: 10 < 200 < 400).
    d = Driver.of(policy, cluster(1, 4)).add(
        J("r", 1, 10, 0), J("big", 4, 50, 1), J("small", 2, 200, 2))
    plan = d.cycle()
    assert set(plan.run) == {"r", "small"}
    assert d.waiting_order() == ["big"]
    st = d.status("big")
    assert st.code is StatusCode.WAITING_FOR_GPUS  # 2 free < 4: not fragmentation
    assert st.reason == "needs 4 GPUs, 1 free"  # r (1) and small (2) hold 3 of 4


# --------------------------------------------------------------------------------------------
# preemption
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("policy", "old", "new", "preempts"),
    [
        # At t=10 the running job has 10 s of progress.
        pytest.param("srtf", J("old", 4, 100, 0), J("new", 4, 50, 10), True,
                     id="srtf-shorter-arrival-preempts"),
        # 95 > 90 remaining: preempting would need the stale 100 s.
        pytest.param("srtf", J("old", 4, 100, 0), J("new", 4, 95, 10), False,
                     id="srtf-uses-remaining-not-total"),
        pytest.param("srtf", J("old", 1, 300, 0), J("new", 4, 80, 10), True,
                     id="srtf-80s-beats-290s"),
        # GPU-time: old 1 × 290 = 290 < new 4 × 80 = 320.
        pytest.param("srsf", J("old", 1, 300, 0), J("new", 4, 80, 10), False,
                     id="srsf-1gpu-long-beats-4gpu-short"),
        # GPU-time: new 2 × 150 = 300 < old 4 × 90 = 360; new takes 2 of old's GPUs.
        pytest.param("srsf", J("old", 4, 100, 0), J("new", 2, 150, 10), True,
                     id="srsf-smaller-gpu-time-preempts"),
        pytest.param("fifo", J("old", 4, 100, 0), J("new", 4, 1, 10), False,
                     id="fifo-never-preempts-for-later-submit"),
        # A job submitted earlier (but admitted later, e.g. a late trace record) outranks.
        pytest.param("fifo", J("old", 4, 100, 5), J("new", 4, 100, 0), True,
                     id="fifo-earlier-submit-preempts"),
    ],
)
def test_preemption_by_a_better_ranked_waiting_job(
    policy: str, old: JobSpec, new: JobSpec, preempts: bool
) -> None:
    d = Driver.of(policy, cluster(1, 4)).add(old)
    first = d.cycle(0.0).run["old"]
    d.advance(10.0)
    d.add(new)
    plan = d.cycle()
    if preempts:
        assert "new" in plan.run and "old" not in plan.run
        assert d.jobs["old"].preemptions == 1
        st = d.status("old")
        # Waiting behind the newcomer; when some GPUs are left free, it says how many.
        expected = StatusCode.WAITING_FOR_GPUS if plan.free_gpus else (
            StatusCode.WAITING_FOR_PRIORITY)
        assert st.queue_position == 1 and st.code is expected
    else:
        assert plan.run["old"] == first  # keeps exactly its GPUs
        assert "new" not in plan.run
        assert d.waiting_order() == ["new"]


@dataclass(frozen=True)
class Step:
    at: float
    add: tuple[JobSpec, ...]
    running: set[str]
    waiting: list[str]


@pytest.mark.parametrize(
    ("policy", "steps"),
    [
        # 1 × 4 GPUs. srtf keys: t=10: old 90 < mid 95; t=30: short 20 < old 70 < mid 95.
        pytest.param("srtf", [
            Step(0, (J("old", 4, 100, 0),), {"old"}, []),
            Step(10, (J("mid", 4, 95, 10),), {"old"}, ["mid"]),
            Step(30, (J("short", 4, 20, 30),), {"short"}, ["old", "mid"]),
            Step(50, (), {"old"}, ["mid"]),  # short done; old (70 left) before mid (95)
            Step(120, (), {"mid"}, []),  # old done at 50 + 70
            Step(215, (), set(), []),
        ], id="srtf-preempted-job-keeps-its-remaining-time-key"),
        # srsf keys (GPU-s): t=10: old 2×90 = 180 < mid 4×46 = 184; t=30: short 4×5 = 20 <
        # old 2×70 = 140 < mid 184. When old runs again, mid still cannot fit (2 free < 4).
        pytest.param("srsf", [
            Step(0, (J("old", 2, 100, 0),), {"old"}, []),
            Step(10, (J("mid", 4, 46, 10),), {"old"}, ["mid"]),
            Step(30, (J("short", 4, 5, 30),), {"short"}, ["old", "mid"]),
            Step(35, (), {"old"}, ["mid"]),
            Step(105, (), {"mid"}, []),
            Step(151, (), set(), []),
        ], id="srsf-preempted-job-keeps-its-gpu-time-key"),
        # fifo: c fills the GPUs b (4) cannot use; b runs only when a is done.
        pytest.param("fifo", [
            Step(0, (J("a", 2, 100, 0),), {"a"}, []),
            Step(1, (J("b", 4, 50, 1),), {"a"}, ["b"]),
            Step(2, (J("c", 2, 30, 2),), {"a", "c"}, ["b"]),
            Step(32, (), {"a"}, ["b"]),
            Step(100, (), {"b"}, []),
            Step(150, (), set(), []),
        ], id="fifo-skips-a-job-that-does-not-fit"),
    ],
)
def test_scenario_cycle_by_cycle(policy: str, steps: list[Step]) -> None:
    d = Driver.of(policy, cluster(1, 4))
    placements: dict[str, object] = {}
    for step in steps:
        d.advance(step.at)
        d.add(*step.add)
        plan = d.cycle()
        assert set(plan.run) == step.running, f"t={step.at}"
        assert d.waiting_order() == step.waiting, f"t={step.at}"
        for jid, slots in plan.run.items():  # a job that keeps running keeps its GPUs
            if jid in placements:
                assert slots == placements[jid], f"t={step.at} {jid}"
        placements = dict(plan.run)
    assert not d.jobs


@pytest.mark.parametrize("policy", ORDERED)
def test_removed_waiting_job_leaves_the_queue(policy: str) -> None:
    d = Driver.of(policy, cluster(1, 4)).add(
        J("a", 4, 10, 0), J("b", 4, 20, 1), J("c", 4, 30, 2))
    d.cycle()
    del d.jobs["b"]
    d.policy.job_removed("b")
    d.cycle()
    assert d.status("b").queue_position is None
    assert d.waiting_order() == ["c"]
    assert d.running == {"a"}


# --------------------------------------------------------------------------------------------
# cycles planned in place
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("policy", "running", "waiting", "stays"),
    [
        pytest.param("srtf", [J("a", 8, 100)], [J("b", 8, 200, 1)], True,
                     id="srtf-waiting-job-is-longer"),
        pytest.param("srtf", [J("a", 8, 100)], [J("b", 1, 10, 1)], False,
                     id="srtf-waiting-job-is-shorter"),
        pytest.param("srsf", [J("a", 1, 100)], [J("b", 8, 50, 1)], True,
                     id="srsf-less-time-but-more-gpu-time"),
        pytest.param("fifo", [J("a", 8, 100, 0)], [J("b", 1, 1, 5)], True,
                     id="fifo-later-submission"),
        pytest.param("srtf", [], [], True, id="nothing-runs"),
        pytest.param("tiresias", [J("a", 8, 100)], [J("b", 8, 200, 1)], False,
                     id="tiresias-always-walks"),
    ],
)
def test_running_jobs_stay_only_while_every_waiting_job_ranks_after_them(
    policy: str, running: list[JobSpec], waiting: list[JobSpec], stays: bool
) -> None:
    d = Driver.of(policy, cluster(1, 8)).add(*running)
    d.cycle()
    assert d.running == {j.job_id for j in running}
    d.add(*waiting)
    assert d.policy.running_stays(d.snapshot()) is stays


# --------------------------------------------------------------------------------------------
# the last running job's rank, bounded (`OrderedPolicy.keys_fall`)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("reported", "stays"), [
    pytest.param(frozenset({"a"}), False, id="a-report-is-taken-again"),
    pytest.param(frozenset(), True, id="unreported-the-old-key-stands"),
])
def test_a_running_job_set_back_by_a_report_is_ranked_anew(reported: frozenset[str],
                                                           stays: bool) -> None:
    """a (200 s, half done) and b (120 s) run on the only 4 GPUs. A node's report then sets
    a back to 180 s left, behind c (150 s, waiting): c now ranks ahead of a running job, so
    the cycle cannot be planned in place. Only the report says so: the keys taken at the last
    check put b (120 s) last, and b's key still stands."""
    a, b, c = J("a", 2, 200), J("b", 2, 120), J("c", 2, 150)
    policy = policies.make("srtf")
    assert isinstance(policy, OrderedPolicy) and policy.keys_fall
    first = {"a": view(a, False, a.iterations / 2), "b": view(b)}
    for v in first.values():
        policy.job_added(v)
    fit = CyclePlacement(cluster(1, 4), "consolidated", {})
    assert set(policy.plan(_snapshot(first, []), fit).run) == {"a", "b"}
    d = J("d", 2, 1000)  # waits behind both: their keys are taken (100 s, 120 s)
    policy.job_added(view(d))
    running = {"a": view(a, True, a.iterations / 2), "b": view(b, True), "d": view(d)}
    assert policy.running_stays(_snapshot(running, ["a", "b"]))
    policy.job_added(view(c))
    back = a.iterations * 0.1  # 180 of 200 s left
    later = {**running, "a": view(a, True, back), "c": view(c)}
    assert later["a"].remaining_s == pytest.approx(180.0)
    snap = _snapshot(later, ["a", "b"], reported)
    assert policy.running_stays(snap) is stays


@dataclass
class Overtaken:
    """a (100 s) and b (1,000 s) run on the only 4 GPUs, their keys taken (d, 5,000 s, waits
    behind both); c (500 s) has just arrived, ahead of b only."""

    policy: OrderedPolicy
    fit: CyclePlacement
    started: dict[str, GpuSlots]
    views: dict[str, JobView]


def overtaken() -> Overtaken:
    a, b, c, d = J("a", 2, 100), J("b", 2, 1000), J("c", 2, 500), J("d", 2, 5000)
    policy = policies.make("srtf")
    assert isinstance(policy, OrderedPolicy)
    fit = CyclePlacement(cluster(1, 4), "consolidated", {})
    first = {"a": view(a), "b": view(b)}
    for v in first.values():
        policy.job_added(v)
    started = policy.plan(_snapshot(first, []), fit).run
    assert set(started) == {"a", "b"}
    running = {"a": view(a, True), "b": view(b, True), "c": view(c), "d": view(d)}
    for jid in started:
        policy.job_running(running[jid])
        fit.bind(jid, started[jid])
    fit.next_cycle()
    policy.job_added(running["d"])
    assert policy.running_stays(_snapshot(running, ["a", "b"]))
    policy.job_added(running["c"])
    return Overtaken(policy, fit, started, running)


@pytest.mark.parametrize(("irregular", "read", "listed"), [
    pytest.param(frozenset(), {"b"}, False, id="the-job-ahead-stays-unread-unlisted"),
    pytest.param(frozenset({"a"}), {"a", "b"}, True, id="a-job-ahead-sharing-gpus-is-walked"),
    pytest.param(frozenset({"b"}), {"b"}, False,
                 id="a-job-behind-sharing-gpus-is-walked-anyway"),
])
def test_a_full_walk_ranks_only_the_running_jobs_that_may_rank_behind_a_waiting_one(
        irregular: frozenset[str], read: set[str], listed: bool) -> None:
    """c displaces b (`overtaken`). The walk leaves a where it runs without reading it, and
    the plan lists only what it walked (`Plan.stay`), unless a may not simply get its GPUs
    back (`RunningJobs.irregular`): then it walks and lists every running job."""
    case = overtaken()
    views = ReadViews(case.views)
    plan = case.policy.plan(_snapshot(views, ["a", "b"], irregular=irregular), case.fit)
    after = running_after(plan, case.started)
    assert after == {"a": case.started["a"], "c": case.started["b"]}
    assert plan.stopped(case.started) == ["b"]
    assert ("a" in plan.run) is listed
    assert views.read - {"c", "d"} == read


def test_after_a_full_walk_the_kept_jobs_bounds_stand() -> None:
    """a stays ahead unread, c displaces b (`overtaken`). The next check takes the key of
    c, which started, and of the last running job again (c), but not a's: its bound stands."""
    case = overtaken()
    plan = case.policy.plan(_snapshot(case.views, ["a", "b"]), case.fit)
    assert running_after(plan, case.started) == {"a": case.started["a"],
                                                  "c": case.started["b"]}
    after = ReadViews({**case.views, "b": view(case.views["b"].spec),
                       "c": view(case.views["c"].spec, True)})
    assert case.policy.running_stays(_snapshot(after, ["a", "c"]))
    assert after.read == {"c"}


@dataclass
class Stale:
    """Running jobs whose keys were taken at an earlier check (`taken`: seconds left then),
    each having run `ran` seconds since, and waiting jobs (seconds), all on one GPU each.
    z waits far behind everything, so that every check reads the running jobs' keys."""

    policy: OrderedPolicy
    views: dict[str, JobView]
    running: list[str]
    waiting: list[str]

    @classmethod
    def of(cls, taken: list[float], ran: list[float], waiting: list[float]) -> Stale:
        policy = policies.make("srtf")
        assert isinstance(policy, OrderedPolicy) and policy.keys_fall
        specs = [J(f"r{i}", 1, s) for i, s in enumerate(taken)]
        running = [spec.job_id for spec in specs]
        z = J("z", 1, 1e9)
        policy.job_added(view(z))
        for spec in specs:
            policy.job_added(view(spec))
            policy.job_running(view(spec, True))
        then = {spec.job_id: view(spec, True) for spec in specs}
        policy.running_stays(_snapshot({**then, "z": view(z)}, running))  # keys taken
        views = {"z": view(z)}
        for spec, seconds in zip(specs, ran, strict=True):
            views[spec.job_id] = view(spec, True, seconds)  # iterations of one second
        for i, seconds in enumerate(waiting):
            spec = J(f"w{i}", 1, seconds)
            policy.job_added(view(spec))
            views[spec.job_id] = view(spec)
        return cls(policy, views, running, ["z", *(f"w{i}" for i in range(len(waiting)))])

    def last_running(self) -> tuple[tuple[object, ...], str]:
        """The last running job's rank, from every running job's key now."""
        return max((self.policy.key(self.views[j]), j) for j in self.running)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(100, 400), st.integers(0, 150)), min_size=1,
                max_size=12),
       st.lists(st.integers(1, 450), max_size=6))
def test_the_last_running_rank_a_check_uses_compares_with_every_waiting_job_as_the_true_one(
        running: list[tuple[int, int]], waiting: list[int]) -> None:
    """However stale the keys taken earlier, the rank the checks use (`_worst`: a bound
    taken again only as far as the waiting jobs need) ranks ahead of and behind the same
    waiting jobs as the last running job's true rank, and the cycle stays in place exactly
    when every waiting job ranks behind it."""
    case = Stale.of([float(s) for s, _ in running], [float(r) for _, r in running],
                    [float(s) for s in waiting])
    snap = _snapshot(case.views, case.running)
    true_last = case.last_running()
    used = case.policy._worst(snap)
    for jid in case.waiting:
        rank = (case.policy.key(case.views[jid]), jid)
        assert (used < rank) == (true_last < rank), jid
    stays = all(true_last < (case.policy.key(case.views[j]), j) for j in case.waiting)
    assert case.policy.running_stays(_snapshot(case.views, case.running)) is stays


@pytest.mark.parametrize(("waiting", "stays", "read"), [
    pytest.param(500.0, False, {"r9"}, id="none-between-the-last-alone"),
    pytest.param(995.0, True, {f"r{i}" for i in range(10)}, id="one-between-all-again"),
])
def test_a_check_takes_keys_again_only_as_far_as_the_waiting_jobs_need(
        waiting: float, stays: bool, read: set[str]) -> None:
    """Ten running jobs, 1,000–1,009 s left when their keys were taken, have each run 20 s
    since. Taken again, the last has 989 s left, and no other can rank behind it by more
    than its bound, 1,008 s. A waiting job ahead of them all (500 s) ranks alike against
    any rank in between, so one key is read; one in between (995 s) does not, so keys are
    read until the true last one stands (989 s: the waiting job ranks behind it)."""
    case = Stale.of([1000.0 + i for i in range(10)], [20.0] * 10, [waiting])
    views = ReadViews(case.views)
    assert case.policy.running_stays(_snapshot(views, case.running)) is stays
    assert views.read & set(case.running) == read


def _snapshot(views: dict[str, JobView], running: list[str],
              reported: frozenset[str] = frozenset(),
              irregular: frozenset[str] = frozenset()) -> Snapshot:
    """A cycle's snapshot as the scheduler makes it: running jobs' views made when read."""
    made = RunningJobs(dict.fromkeys(running).keys(),
                       lambda: tuple(views[j] for j in running), reported, irregular=irregular)
    return Snapshot(0.0, cluster(1, 4), MappingProxyType(views), made)


@pytest.mark.parametrize(("name", "done", "with_record", "read"), [
    pytest.param("srtf", 40.0, True, set(), id="srtf-from-the-record-unread"),
    pytest.param("srsf", 40.0, True, set(), id="srsf-from-the-record-unread"),
    pytest.param("srtf", 130.0, True, set(), id="srtf-overrun-counts-as-none-left"),
    pytest.param("srtf", 40.0, False, {"a"}, id="srtf-no-record-from-the-view"),
])
def test_remaining_time_ranks_a_running_job_from_its_record(
        name: str, done: float, with_record: bool, read: set[str]) -> None:
    """srtf and srsf rank a running job by its remaining time: from its record's iterations
    done where the snapshot gives them without views, the very key its view would give."""
    a = make_job("a").gpus(2).iterations(120).submit(3.0).build()
    views = ReadViews({"a": view(a, True, done)})
    left = {"a": (a, view(a, True, done).remaining_s)}
    running = RunningJobs(["a"], lambda: (views["a"],), spec_of={"a": a}.get,
                          left_of=left.__getitem__ if with_record else None)
    snap = Snapshot(0.0, cluster(1, 4), MappingProxyType(views), running)
    policy = policies.make(name)
    assert policy.running_key("a", snap) == policy.key(view(a, True, done))
    assert views.read == read


@pytest.mark.parametrize(("with_specs", "read"), [
    pytest.param(True, set(), id="from-the-spec-unread"),
    pytest.param(False, {"a"}, id="no-specs-from-the-view"),
])
def test_fifo_ranks_a_running_job_from_its_spec(with_specs: bool, read: set[str]) -> None:
    """fifo's key is the submit time: a walk ranks a running job from its spec where the
    snapshot gives specs without views, and the key is the same either way."""
    a = make_job("a").submit(7.0).build()
    views = ReadViews({"a": view(a, True)})
    running = RunningJobs(["a"], lambda: (views["a"],),
                          spec_of={"a": a}.get if with_specs else None)
    snap = Snapshot(0.0, cluster(1, 4), MappingProxyType(views), running)
    policy = policies.make("fifo")
    assert policy.running_key("a", snap) == policy.key(view(a, True))
    assert views.read == read
