"""Chronus' lease plan can always be laid out term by term (issue 18).

The lease MILP merges the terms after its horizon into segments packed only in aggregate, a
relaxation: a selection can fit a segment's GPU-terms and still have no per-term layout. Every
selection `LeaseSolver.select` returns is a guarantee, so it must have one: each chosen job on
exactly its required number of distinct terms, all before its deadline, no term over capacity.

Two properties, checked by an oracle written here (not the module's own checks):
* the real solver, on random lease problems: its selection lays out, and a MILP selection keeps
  as many jobs as the exact problem (no merged terms) does;
* solver-independent: whatever aggregate-feasible selection the MILP step answers (random ones,
  often not layable), `select` never returns one that does not lay out.

Examples: `LOOM_CHRONUS_EXAMPLES` (default 200 with the solver, twice that without it).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies.chronus.lease import LeaseProblem, Selection
from policies.chronus.milp import LeaseSolver
from policies.chronus.packing import unpack
from policies.chronus.policy import bin_gpus

EXAMPLES = int(os.environ.get("LOOM_CHRONUS_EXAMPLES", "200"))
FAST = settings(max_examples=2 * EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
SOLVED = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
EXACT_HORIZON = 21  # past every deadline drawn: no merged terms, the exact problem
# One solver per horizon for the whole module: compiled problems are reused across examples.
SOLVERS = {h: LeaseSolver(horizon=h) for h in (1, 2, 3, 4, EXACT_HORIZON)}


@st.composite
def lease_problems(draw: st.DrawFn) -> tuple[LeaseProblem, int]:
    """2–7 jobs (binned sizes up to the cluster), capacities 4/8/16, deadlines up to 20
    terms, horizons 1–4."""
    capacity = draw(st.sampled_from([4, 8, 16]))
    sizes = sorted({bin_gpus(g) for g in range(1, capacity + 1)})
    n = draw(st.integers(2, 7))
    deadline = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    required = [draw(st.integers(0, d)) for d in deadline]
    gpus = draw(st.lists(st.sampled_from(sizes), min_size=n, max_size=n))
    problem = LeaseProblem(tuple(gpus), tuple(required), tuple(deadline), capacity,
                           spare_now=draw(st.booleans()))
    return problem, draw(st.integers(1, 4))


def violations(p: LeaseProblem, sel: Selection) -> list[str]:
    """What the selection's per-term layout breaks of the exact problem."""
    found = []
    used: dict[int, int] = {}
    for i, terms in enumerate(unpack(p, sel)):
        got = [int(b) for b in terms]
        want = p.required[i] if sel.chosen[i] else 0
        if len(set(got)) != len(got) or len(got) != want:
            found.append(f"job {i}: terms {got}, needs {want} distinct ones")
        if any(b < 0 or b >= p.deadline[i] for b in got):
            found.append(f"job {i}: terms {got} not all before its deadline {p.deadline[i]}")
        for b in got:
            used[b] = used.get(b, 0) + p.gpus[i]
    found += [f"term {b}: {u} GPUs > {p.capacity}" for b, u in sorted(used.items())
              if u > p.capacity]
    return found


@SOLVED
@given(lease_problems())
def test_every_selection_lays_out_within_capacity(case: tuple[LeaseProblem, int]) -> None:
    p, horizon = case
    refined = _refined(SOLVERS[horizon])
    sel = SOLVERS[horizon].select(p)
    event(f"method: {sel.method}, refined: {_refined(SOLVERS[horizon]) > refined}")
    assert violations(p, sel) == []
    if sel.method == "milp":  # an optimum of a relaxation that lays out is an exact optimum
        exact = SOLVERS[EXACT_HORIZON].select(p)
        if exact.method == "milp":  # proven optimal too (not stopped at the node limit)
            assert sum(sel.chosen) == sum(exact.chosen)


def _refined(solver: LeaseSolver, stat: str = "refined") -> int:
    # for statistics only; read leniently, so that these tests also run (and fail) on the
    # code before issue 18, whose stats had no refinements
    return int(getattr(solver.stats, stat, 0))


# -- solver-independent: the MILP step answers any aggregate-feasible selection ----------------

def cut_segments(deadline: Iterable[int], horizon: int,
                 cuts: Iterable[int]) -> list[tuple[int, int]]:
    """Segments after the horizon, cut at every deadline and at `cuts` (each holds terms that
    are interchangeable for every job)."""
    deadline = list(deadline)
    last = max(deadline)
    points = sorted({d for d in deadline if d > horizon} | {c for c in cuts if horizon < c < last})
    return list(zip([horizon, *points][:len(points)], points, strict=True))


def aggregate_answer(p: LeaseProblem, horizon: int, cuts: Iterable[int],
                     rng: random.Random) -> Selection:
    """A random selection that keeps the MILP's constraints: exact terms per term, merged
    terms only in aggregate per segment (mostly filling segments one by one, which makes
    selections that do not lay out)."""
    segs = cut_segments(p.deadline, horizon, cuts)
    exact_free = [p.capacity] * horizon
    seg_free = [p.capacity * (b - a) for a, b in segs]
    chosen, exact, tail = [False] * p.n, [()] * p.n, [(0,) * len(segs)] * p.n
    for i in rng.sample(range(p.n), p.n):
        if rng.random() < 0.2:
            continue
        g = p.gpus[i]
        slots = [("x", b) for b in range(min(p.deadline[i], horizon)) if exact_free[b] >= g]
        slots += [("s", j) for j, (a, b) in enumerate(segs) if b <= p.deadline[i]
                  for _ in range(b - a)]
        rng.shuffle(slots)
        if rng.random() < 0.8:  # merged terms first, a segment at a time: packing conflicts
            rank = rng.sample(range(len(segs)), len(segs))
            slots.sort(key=lambda s: len(segs) if s[0] == "x" else rank[s[1]])
        terms: list[int] = []
        counts = [0] * len(segs)
        room = list(seg_free)
        for kind, j in slots:
            if len(terms) + sum(counts) == p.required[i]:
                break
            if kind == "x" and j not in terms:
                terms.append(j)
            elif kind == "s" and room[j] >= g:
                counts[j] += 1
                room[j] -= g
        if len(terms) + sum(counts) < p.required[i]:
            continue  # does not fit in aggregate either: not chosen
        for b in terms:
            exact_free[b] -= g
        seg_free = room
        chosen[i], exact[i], tail[i] = True, tuple(sorted(terms)), tuple(counts)
    return Selection(tuple(chosen), tuple(exact), tuple(tail), tuple(segs), "fake")


@FAST
@given(lease_problems(), st.randoms(use_true_random=False))
def test_no_unlaid_selection_is_returned_whatever_the_milp_answers(
        case: tuple[LeaseProblem, int], rng: random.Random) -> None:
    p, horizon = case
    solver = LeaseSolver(horizon=horizon)

    def answer(q: LeaseProblem, cuts: Iterable[int] = ()) -> Selection:
        return aggregate_answer(q, horizon, cuts, rng)

    solver._milp = answer  # type: ignore[method-assign]  # the MILP step, without a solver
    sel = solver.select(p)
    event(f"method: {sel.method}, refinements: {min(_refined(solver, 'refinements'), 3)}")
    assert sel.method in ("fake", "greedy")
    assert violations(p, sel) == []


def test_the_fake_milp_answers_unlayable_selections() -> None:
    # The solver-independent property is worth something only if the fake answers selections
    # that do not lay out: count the problems whose first answer sends `select` to refine.
    unlaid = 0
    for seed in range(200):
        rng = random.Random(seed)
        p, horizon = random_problem(rng)
        solver = LeaseSolver(horizon=horizon)
        solver._milp = (  # type: ignore[method-assign]
            lambda q, cuts=(), h=horizon, r=rng: aggregate_answer(q, h, cuts, r))
        assert violations(p, solver.select(p)) == []
        unlaid += solver.stats.refined
    assert unlaid >= 20


def random_problem(rng: random.Random) -> tuple[LeaseProblem, int]:
    """As `lease_problems` draws them, from a seeded generator."""
    capacity = rng.choice([4, 8, 16])
    sizes = sorted({bin_gpus(g) for g in range(1, capacity + 1)})
    deadline = [rng.randint(1, 20) for _ in range(rng.randint(2, 7))]
    return LeaseProblem(tuple(rng.choice(sizes) for _ in deadline),
                        tuple(rng.randint(0, d) for d in deadline), tuple(deadline),
                        capacity), rng.randint(1, 4)
