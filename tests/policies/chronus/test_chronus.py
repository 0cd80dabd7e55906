"""Chronus (lease terms, a MILP selects the deadline jobs), as ElasticFlow's artifact runs it."""

from __future__ import annotations

import numpy as np
import pytest

from policies.chronus.lease import LeaseProblem, Selection, consistent, fits, segments
from policies.chronus.milp import LeaseSolver, greedy_selection, milp_data, shape_for
from policies.chronus.packing import (
    check_selection,
    earliest_limit,
    lay_out_segment,
    layout,
    packable,
    unlaid_segments,
    unpack,
)
from policies.chronus.policy import Chronus, Tier, bin_gpus, estimate_s, leases_for
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from tests.builders import cluster, make_job, simulate
from tests.policies.driver import Driver

LEASE = 240.0
FOUR = cluster(1, 4)  # one node, 4 GPUs


def job(jid: str, gpus: int, seconds: float, deadline: float | None = None,
        submit: float = 0.0, best_effort: bool = False) -> JobSpec:
    b = make_job(jid).gpus(gpus).runs_for(seconds).submit(submit)
    if deadline is not None or best_effort:
        b = b.deadline(deadline if deadline is not None else 1e12, best_effort)
    return b.build()


def driver(cl: ClusterSpec = FOUR, tolerance: float = 1.0) -> tuple[Driver, Chronus]:
    policy = Chronus(lease_s=LEASE, tolerance=tolerance)
    return Driver(policy, cl), policy


# -- sizes and counts --------------------------------------------------------------------------

@pytest.mark.parametrize(("gpus", "binned"), [
    (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (6, 8), (7, 8), (8, 8),
    (12, 12), (16, 16),  # the artifact's convert_to_bin leaves counts above 8 as they are
])
def test_gpu_counts_are_binned_as_chronus_does(gpus: int, binned: int) -> None:
    assert bin_gpus(gpus) == binned


@pytest.mark.parametrize(("work", "gpus", "estimate", "leases"), [
    (1000.0, 1, 1102, 5),   # 1000 × (1 + 1 × 0.5 / 240) × 1.1 = 1102.3
    (1000.0, 4, 1106, 5),   # 1000 × (1 + 3 × 0.5 / 240) × 1.1 = 1106.9
    (200.0, 1, 220, 1),
    (240.0, 16, 266, 2),    # padding pushes a one-term job into a second term
])
def test_estimate_pads_the_run_time_and_counts_terms(work: float, gpus: int, estimate: int,
                                                     leases: int) -> None:
    assert estimate_s(work, gpus, LEASE) == estimate
    assert leases_for(estimate, LEASE) == leases


@pytest.mark.parametrize(("seconds", "terms"), [(0, 0), (-5, 0), (1, 1), (240, 1), (241, 2)])
def test_lease_counting(seconds: float, terms: int) -> None:
    assert leases_for(seconds, LEASE) == terms


def test_terms_after_the_horizon_are_cut_at_each_deadline() -> None:
    assert segments([3, 20, 20, 40, 8], 8) == ((8, 20), (20, 40))
    assert segments([3, 8], 8) == ()
    # refinements cut more; cuts outside (horizon, last deadline) change nothing
    assert segments([3, 20, 40], 8, [14, 30, 5, 8, 40, 50]) == (
        (8, 14), (14, 20), (20, 30), (30, 40))


@pytest.mark.parametrize(("jobs", "cuts", "shape"), [
    (3, (), (4, 2, 4)),
    (5, (), (8, 2, 8)),
    (2, (4, 5, 6, 7, 8), (4, 2, 8)),  # 6 segments > 4 jobs: their own power of two
    (6, (4, 5, 6, 7, 8), (8, 2, 8)),
])
def test_shape_pads_jobs_and_segments(jobs: int, cuts: tuple[int, ...],
                                      shape: tuple[int, int, int]) -> None:
    p = LeaseProblem((1,) * jobs, (1,) * jobs, (10,) * jobs, 4)
    assert shape_for(p, 2, cuts) == shape
    assert len(milp_data(p, shape, cuts).segments) == len(cuts) + 1


def test_milp_data_masks_terms_after_each_deadline() -> None:
    p = LeaseProblem(gpus=(1, 4), required=(1, 2), deadline=(2, 5), capacity=8)
    d = milp_data(p, (4, 3, 4))
    assert d.mask.tolist() == [[1, 1, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert d.segments == ((3, 5),)
    assert d.seg_cap[:, 0].tolist() == [0, 2, 0, 0]  # only job 1 reaches past term 3
    assert d.cap_seg.tolist() == [16, 0, 0, 0]
    assert d.required.tolist() == [1, 2, 0, 0] and d.value.tolist() == [10, 10, 0, 0]
    assert d.tie.tolist() == [1 / 8, 4 / 8, 0, 0]
    spare = milp_data(LeaseProblem((1, 4), (1, 2), (2, 5), 8, spare_now=True), (4, 3, 4))
    assert spare.tie.tolist() == [-1 / 8, -4 / 8, 0, 0]


# -- the lease MILP --------------------------------------------------------------------------

SELECTION_CASES = {
    # name: (gpus, required, deadline, capacity, jobs kept, jobs that must be kept)
    "two small jobs beat one big": ((8, 4, 4), (1, 1, 1), (1, 1, 1), 8, 2, {1, 2}),
    "the later deadline uses the later term": ((4, 4, 4), (1, 1, 1), (1, 1, 2), 4, 2, {2}),
    "too few terms before the deadline": ((1, 1), (3, 1), (2, 2), 4, 1, {1}),
    "a full packing keeps every job": ((4, 4, 8), (2, 2, 1), (3, 3, 3), 8, 3, {0, 1, 2}),
    "capacity binds per term": ((4, 4), (2, 2), (3, 3), 4, 1, set()),
    "binned sizes share a term": ((4, 2, 2), (1, 1, 1), (1, 1, 1), 8, 3, {0, 1, 2}),
    "merged terms after the horizon": ((4, 4, 4), (4, 4, 3), (10, 10, 10), 4, 2, set()),
}


@pytest.mark.parametrize("case", SELECTION_CASES.values(), ids=SELECTION_CASES.keys())
@pytest.mark.parametrize("horizon", [2, 16])
def test_milp_keeps_the_most_deadlines(case: tuple[tuple[int, ...], tuple[int, ...],
                                                   tuple[int, ...], int, int, set[int]],
                                       horizon: int) -> None:
    gpus, required, deadline, capacity, kept, must = case
    p = LeaseProblem(gpus, required, deadline, capacity)
    solver = LeaseSolver(horizon=horizon)
    sel = solver.select(p)
    assert sel.method == "milp"
    assert sum(sel.chosen) == kept
    assert all(sel.chosen[i] for i in must)
    assert check_selection(p, sel)
    assert solver.stats.dropped == len(gpus) - kept


@pytest.mark.parametrize(("spare_now", "runs_now"), [(False, True), (True, False)])
def test_adaptive_objective_uses_or_spares_the_current_term(spare_now: bool,
                                                             runs_now: bool) -> None:
    # While no unaccepted job waits, the plan runs jobs as early as it can; otherwise it
    # leaves the current term's GPUs to them.
    p = LeaseProblem((4, 2), (1, 2), (3, 3), 6, spare_now=spare_now)
    sel = LeaseSolver().select(p)
    assert sel.chosen == (True, True)
    assert sel.run_now == (runs_now, runs_now)


def test_a_solve_is_repeatable() -> None:
    p = LeaseProblem((4, 4, 2, 1, 1, 8), (3, 2, 5, 1, 7, 2), (6, 4, 30, 2, 12, 40), 8)
    a, b = LeaseSolver(horizon=4).select(p), LeaseSolver(horizon=4).select(p)
    assert a == b and check_selection(p, a)


@pytest.mark.parametrize(("gpus", "required", "deadline", "capacity", "horizon"), [
    # issue 18: the first MILP answer of each packs a merged segment only in aggregate
    ((4, 2, 2, 1), (3, 8, 3, 6), (12, 10, 20, 9), 4, 2),
    ((1, 8, 1, 1, 1, 1), (2, 2, 0, 0, 0, 0), (3, 3, 1, 1, 1, 1), 8, 1),
])
def test_unpack_lays_merged_terms_out_within_capacity(
        gpus: tuple[int, ...], required: tuple[int, ...], deadline: tuple[int, ...],
        capacity: int, horizon: int) -> None:
    p = LeaseProblem(gpus, required, deadline, capacity)
    solver = LeaseSolver(horizon=horizon)
    sel = solver.select(p)
    assert sel.method == "milp" and solver.stats.refined == 1 and solver.stats.unlaid == 0
    assert sum(sel.chosen) == sum(LeaseSolver(horizon=max(deadline)).select(p).chosen)
    terms = unpack(p, sel)
    used = np.zeros(max(deadline), dtype=int)
    for i, t in enumerate(terms):
        assert len(t) == (p.required[i] if sel.chosen[i] else 0)
        assert len(set(t.tolist())) == len(t) and all(t < p.deadline[i])
        used[t] += p.gpus[i]
    assert used.max() <= capacity


LAYOUTS = {
    # name: (gpus, counts, length, capacity, terms per job or None)
    "issue 18: aggregate 8 ≤ 2 × 4, one term left for a job needing two": (
        (4, 2), (1, 2), 2, 4, None),
    "a third term makes room": ((4, 2), (1, 2), 3, 4, ((2,), (0, 1))),
    "largest first, then on the emptiest terms, latest first": (
        (1, 2, 2), (2, 1, 1), 2, 4, ((0, 1), (1,), (0,))),
    "small jobs share every term": ((1, 1, 2), (2, 2, 2), 2, 4, ((0, 1), (0, 1), (0, 1))),
    "more terms than the segment has": ((1,), (3,), 2, 4, None),
    "one term holds what fits in aggregate": ((2, 1, 1), (1, 1, 1), 1, 4, ((0,), (0,), (0,))),
    "no terms wanted": ((4,), (0,), 3, 4, ((),)),
}


@pytest.mark.parametrize("case", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_lay_out_segment(case: tuple[tuple[int, ...], tuple[int, ...], int, int,
                                     tuple[tuple[int, ...], ...] | None]) -> None:
    gpus, counts, length, capacity, want = case
    got = lay_out_segment(gpus, counts, length, capacity)
    assert (None if got is None else tuple(tuple(t.tolist()) for t in got)) == want


def test_a_selection_packed_only_in_aggregate_is_not_a_guarantee() -> None:
    # job 0: 4 GPUs for one term, job 1: 2 GPUs for two, both in the segment [1, 3)
    p = LeaseProblem((4, 2), (1, 2), (3, 3), 4)
    sel = Selection((True, True), ((), ()), ((1,), (2,)), ((1, 3),), "test")
    assert consistent(p, sel) and unlaid_segments(p, sel) == [0]
    assert layout(p, sel) is None and not check_selection(p, sel)
    with pytest.raises(ValueError, match="no per-term layout"):
        unpack(p, sel)
    laid = Selection((True, True), ((0,), ()), ((0,), (2,)), ((1, 3),), "test")
    terms = layout(p, laid)
    assert terms is not None and [t.tolist() for t in terms] == [[0], [1, 2]]
    assert fits(p, laid.chosen, terms) and check_selection(p, laid)


@pytest.mark.parametrize(("chosen", "terms", "ok"), [
    ((True, True), ((0,), (1, 2)), True),
    ((True, True), ((1,), (1, 2)), False),     # term 1 holds 6 GPUs
    ((True, True), ((0,), (1, 1)), False),     # the same term twice
    ((True, True), ((0,), (1, 3)), False),     # term 3 is past job 1's deadline
    ((True, False), ((0,), ()), True),
    ((True, False), ((0,), (1, 2)), False),    # a job left out holds terms
    ((True, True), ((), (1, 2)), False),       # a chosen job short of terms
])
def test_fits_checks_the_exact_constraints(chosen: tuple[bool, ...],
                                           terms: tuple[tuple[int, ...], ...],
                                           ok: bool) -> None:
    p = LeaseProblem((4, 2), (1, 2), (3, 3), 4)
    assert fits(p, chosen, [np.array(t, dtype=np.int64) for t in terms]) is ok


# A 4-GPU job for one term and a 2-GPU job for four, both in the 4-term segment [1, 5) of a
# 4-GPU cluster: 4 + 2 × 4 ≤ 4 × 4 in aggregate, but the 2-GPU job needs every term.
UNLAID = Selection((True, True), ((), ()), ((1,), (4,)), ((1, 5),), "fake")


def _fake_milp(answers: list[Selection], seen: list[set[int]]) -> object:
    """A MILP step that answers `answers` in turn (the last one again once they run out) and
    records the cuts it was asked for."""
    def answer(p: LeaseProblem, cuts: set[int]) -> Selection:
        seen.append(set(cuts))
        return answers[min(len(seen), len(answers)) - 1]
    return answer


@pytest.mark.parametrize(("answers", "method", "cuts", "refinements", "unlaid"), [
    # cut at the segment's midpoint and solve again: the 4-GPU job moves to term 0
    ([UNLAID, Selection((True, True), ((0,), ()), ((0, 0), (2, 2)), ((1, 3), (3, 5)),
                        "fake")], "fake", [set(), {3}], 1, 0),
    ([Selection((True, True), ((0,), ()), ((0,), (4,)), ((1, 5),), "fake")], "fake", [set()],
     0, 0),
    # never lays out: give up after max_refinements (2) and use the greedy
    ([UNLAID], "greedy", [set(), {3}, {3}], 2, 1),
])
def test_select_refines_segments_that_do_not_lay_out(
        answers: list[Selection], method: str, cuts: list[set[int]], refinements: int,
        unlaid: int) -> None:
    p = LeaseProblem((4, 2), (1, 4), (5, 5), 4)
    solver = LeaseSolver(horizon=1, max_refinements=2)
    seen: list[set[int]] = []
    solver._milp = _fake_milp(answers, seen)  # type: ignore[method-assign]
    sel = solver.select(p)
    assert sel.method == method and check_selection(p, sel)
    assert seen == cuts
    assert (solver.stats.refined, solver.stats.refinements, solver.stats.unlaid) == (
        int(refinements > 0 or unlaid > 0), refinements, unlaid)


def test_a_solve_does_not_depend_on_the_one_before() -> None:
    # cvxpy warm-starts HiGHS from the previous solution of a compiled problem by default;
    # from this first problem's, HiGHS called a 4-job plan of the second one optimal (5 fit).
    first = LeaseProblem((13, 16, 13, 13, 2), (6, 9, 8, 0, 0), (16, 20, 15, 1, 12), 16)
    second = LeaseProblem((13, 16, 13, 13, 2), (0, 9, 8, 0, 0), (1, 20, 15, 1, 12), 16)
    solver = LeaseSolver(horizon=21)
    solver.select(first)
    sel = solver.select(second)
    assert sel == LeaseSolver(horizon=21).select(second) and all(sel.chosen)


@pytest.mark.parametrize(("gpus", "required", "deadline", "capacity", "chosen", "terms"), [
    # each job takes its latest terms with room; larger jobs first
    ((1,), (2,), (4,), 4, (True,), ((2, 3),)),
    ((4, 4), (2, 2), (3, 3), 4, (True, False), ((1, 2), ())),
    ((1, 4), (1, 1), (2, 2), 4, (True, True), ((0,), (1,))),
    ((2, 2), (1, 3), (1, 2), 4, (True, False), ((0,), ())),
])
def test_greedy_fallback_packs_latest_terms_first(
        gpus: tuple[int, ...], required: tuple[int, ...], deadline: tuple[int, ...],
        capacity: int, chosen: tuple[bool, ...], terms: tuple[tuple[int, ...], ...]) -> None:
    p = LeaseProblem(gpus, required, deadline, capacity)
    sel = greedy_selection(p)
    assert (sel.chosen, sel.exact, sel.method) == (chosen, terms, "greedy")
    assert check_selection(p, sel)


def test_greedy_is_used_when_the_solver_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from cvxpy.error import SolverError

    def fail(*args: object, **kwargs: object) -> None:
        raise SolverError("boom")

    p = LeaseProblem((4, 4), (2, 2), (3, 3), 4)
    solver = LeaseSolver()
    monkeypatch.setattr(solver.cache.get(shape_for(p, solver.horizon)).problem, "solve", fail)
    sel = solver.select(p)
    assert sel == greedy_selection(p)
    assert solver.stats.failures == 1


def test_greedy_is_used_when_the_time_limit_stops_the_solver() -> None:
    p = LeaseProblem((4, 4, 4, 1, 2), (2, 5, 2, 3, 1), (20, 30, 3, 9, 2), 8)
    solver = LeaseSolver(horizon=4, time_limit_s=0.0)
    assert solver.select(p).method == "greedy"
    assert solver.stats.timeouts == 1


def test_check_selection_rejects_overbooked_terms() -> None:
    p = LeaseProblem((4, 4), (1, 1), (2, 2), 4)
    bad = Selection((True, True), ((0,), (0,)), ((), ()), (), "test")
    good = Selection((True, True), ((0,), (1,)), ((), ()), (), "test")
    assert not check_selection(p, bad) and check_selection(p, good)


# -- admission -------------------------------------------------------------------------------

@pytest.mark.parametrize(("free", "items", "fits"), [
    ([4, 4, 4], [(4, 2, 3)], True),
    ([4, 4, 4], [(4, 2, 3), (4, 2, 3)], False),   # 4 terms wanted in 3
    ([4, 0, 4], [(4, 2, 3)], True),               # terms 0 and 2
    ([4, 0, 4], [(4, 3, 3)], False),
    ([2, 2], [(2, 2, 2), (2, 2, 2)], False),       # 2 GPUs left in each term
    ([4, 4], [(2, 2, 2), (2, 2, 2)], True),
    ([], [(4, 2, 5)], True),                       # after the plan, the cluster is idle
    ([4, 4, 4], [(1, 2, 1)], False),              # needs more terms than it has
])
def test_packable(free: list[int], items: list[tuple[int, int, int]], fits: bool) -> None:
    assert packable(np.array(free, dtype=np.int64), items, 4) is fits


@pytest.mark.parametrize(("free", "batch", "job", "limit"), [
    ([4, 4, 4], [(4, 2, 3)], (4, 2, 3), 4),   # the batch keeps terms 1, 2; it takes 0 and 3
    ([4, 4, 4], [], (4, 2, 3), 3),            # already fits at its own deadline
    ([0, 0, 4], [], (4, 2, 2), 4),            # terms 2 and 3
    ([0, 0, 0], [], (2, 1, 1), 4),            # past the plan: term 3
])
def test_earliest_limit_binary_search(free: list[int], batch: list[tuple[int, int, int]],
                                      job: tuple[int, int, int], limit: int) -> None:
    assert earliest_limit(np.array(free, dtype=np.int64), batch, job, 4) == limit


ADMISSION = {
    # A: 531 s estimated = 3 terms before term 10 (deadline 2400 s; terms counted from 240 s)
    "one fits": ([job("a", 4, 480, 2400)], {"a"}),
    "too long for its deadline": ([job("b", 4, 2000, 2400)], set()),
    "the second does not fit beside the first": (
        [job("a", 4, 480, 2400), job("c", 4, 1400, 2400)], {"a"}),
    "small jobs share terms": (
        [job("a", 2, 1400, 2400), job("c", 2, 1400, 2400)], {"a", "c"}),
    "binned to 4 GPUs, 3-GPU jobs do not share": (
        [job("a", 3, 1400, 2400), job("c", 1, 1400, 2400)], {"a"}),
}


@pytest.mark.parametrize("case", ADMISSION.values(), ids=ADMISSION.keys())
def test_admission_accepts_what_packs(case: tuple[list[JobSpec], set[str]]) -> None:
    jobs, accepted = case
    d, policy = driver()
    d.add(*jobs).cycle(0.0)
    tiers = {j.job_id: policy.jobs[j.job_id].tier for j in jobs}
    assert {jid for jid, t in tiers.items() if t is Tier.ACCEPTED} == accepted
    assert all(t is Tier.UNACCEPTED for jid, t in tiers.items() if jid not in accepted)
    assert policy.accepted == len(accepted)


def test_accepted_deadline_is_held_to_the_term_boundary() -> None:
    d, policy = driver()
    d.add(job("a", 4, 480, 2500)).cycle(0.0)
    rec = policy.jobs["a"]
    assert (rec.end_term, rec.deadline_s, rec.leases_left) == (10, 2400.0, 3)


@pytest.mark.parametrize(("tolerance", "tier", "end_term"), [
    (1.0, Tier.UNACCEPTED, 0),    # Chronus' TOLERATE_RATIO: a later deadline is never offered
    (1.5, Tier.ACCEPTED, 11),     # 10 terms from term 1: ends at 2640 s ≤ 1.5 × 2400 s
    (1.05, Tier.UNACCEPTED, 0),   # 2640 s > 1.05 × 2400 s
])
def test_tolerance_accepts_a_later_deadline(tolerance: float, tier: Tier,
                                            end_term: int) -> None:
    d, policy = driver(tolerance=tolerance)
    d.add(job("b", 4, 2000, 2400)).cycle(0.0)
    assert policy.jobs["b"].tier is tier
    assert policy.jobs["b"].end_term == end_term


# -- a term: lease jobs, then spare GPUs -------------------------------------------------------

def test_accepted_jobs_wait_for_the_next_term_unaccepted_ones_use_spare_gpus() -> None:
    d, policy = driver()
    d.add(job("a", 2, 480, 2400), job("u", 2, 2000, 2100)).cycle(0.0)
    assert policy.jobs["u"].tier is Tier.UNACCEPTED
    assert d.running == {"u"}  # a was admitted after this term's selection
    d.cycle(240.0)
    # u waits unaccepted: the plan spares the current term, so a runs as late as it can
    assert d.running == {"u"}
    assert policy.jobs["a"].leases_left == 3


def test_lease_jobs_run_first_when_nothing_unaccepted_waits() -> None:
    d, policy = driver()
    d.add(job("a", 4, 480, 2400)).cycle(0.0)
    assert d.running == set()
    d.cycle(240.0)
    assert d.running == {"a"} and policy.jobs["a"].leases_left == 2


@pytest.mark.parametrize(("be_gpus", "runs"), [(2, {"a", "e"}), (4, {"a"})])
def test_best_effort_jobs_fill_the_spare_gpus(be_gpus: int, runs: set[str]) -> None:
    d, policy = driver()
    d.add(job("a", 2, 480, 2400), job("e", be_gpus, 5000, best_effort=True)).cycle(0.0)
    assert policy.jobs["e"].tier is Tier.BEST_EFFORT
    assert d.running == {"e"}  # the cluster is idle this term
    d.cycle(240.0)
    assert d.running == runs


def test_spare_gpus_go_to_least_remaining_gpu_time_and_hopeless_jobs_last() -> None:
    d, policy = driver()
    d.add(job("late", 4, 100, 50),      # cannot make its deadline: lowest
          job("long", 4, 1000, 1100),   # unaccepted (5 terms, 3 before its deadline)
          job("short", 4, 600, 700))    # unaccepted, less GPU-time left
    d.cycle(0.0)
    assert policy.jobs["late"].tier is Tier.LOWEST
    assert d.running == {"short"}
    assert d.waiting_order() == ["long", "late"]


def test_a_job_past_its_estimate_is_forced_first_onto_spare_gpus() -> None:
    d, policy = driver()
    d.add(job("a", 4, 480, 2400), job("u", 4, 300, 400)).cycle(0.0)
    assert d.running == {"u"}
    before = policy.jobs["a"].tier
    d.jobs["a"].attained_s = 10_000.0  # as if it had held GPUs past its whole estimate
    d.cycle(240.0)
    assert (before, policy.jobs["a"].tier) == (Tier.ACCEPTED, Tier.UNACCEPTED)
    assert policy.jobs["a"].forced
    assert d.running == {"a"}  # ahead of u, which has less GPU-time left


def test_a_job_the_plan_drops_is_demoted() -> None:
    d, policy = driver()
    d.add(job("a", 4, 480, 2400)).cycle(0.0)
    policy.jobs["a"].end_term = 2  # as if its plan had only one term left for its three
    d.cycle(240.0)
    assert policy.jobs["a"].tier is Tier.UNACCEPTED
    assert policy.solver.stats.dropped == 1
    assert d.running == {"a"}  # it still runs, on the spare GPUs


# -- whole runs ------------------------------------------------------------------------------

def test_simulation_meets_the_accepted_deadlines_and_is_repeatable() -> None:
    jobs = [
        job("a", 4, 2000, 4000),
        job("b", 2, 1500, 2600, submit=100),
        job("c", 2, 3000, 4500, submit=100),
        job("d", 4, 1000, 1300, submit=500),        # hopeless at admission: spare GPUs
        job("e", 1, 4000, submit=0, best_effort=True),
    ]
    runs = [simulate(jobs, "chronus", cluster(1, 8), overhead="none", round_s=240.0)
            for _ in range(2)]
    a, b = runs
    assert a.summary["decision_digest"] == b.summary["decision_digest"]
    assert a.summary["finished"] == 5 and a.summary["replan"] == "round"
    assert {j.job_id for j in a.jobs if j.met_deadline} == {"a", "b", "c"}
    assert a.summary["deadline_jobs"] == 4
