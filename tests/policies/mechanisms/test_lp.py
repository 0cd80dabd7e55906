"""`solve_first`: which solvers it tries, in what order, whose answer it keeps, and what it
counts of that answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cvxpy.error import SolverError

from policies.mechanisms.lp import LpStats, solve_first

Answer = tuple[str, float | None] | None  # (status, value); None: the solver raises


class _Scripted:
    """A problem whose solvers answer as scripted, recording which were asked."""

    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.status: str | None = None
        self.x = SimpleNamespace(value=None)

    def solve(self, *, solver: str, **_: Any) -> None:
        self.asked.append(solver)
        answer = self.answers[solver]
        if answer is None:
            raise SolverError(f"{solver} failed")
        self.status, value = answer
        self.x.value = None if value is None else np.array([value])


OPT, INACC = "optimal", "optimal_inaccurate"


@pytest.mark.parametrize(("solvers", "answers", "asked", "kept", "counted"), [
    # the first optimal answer ends the search
    (("CLARABEL", "SCS"), {"CLARABEL": (OPT, 0.25), "SCS": (OPT, 0.5)},
     ["CLARABEL"], (0.25, OPT), (0, 0)),
    # an interior-point solver's inaccurate answer is not re-solved by a first-order one
    (("CLARABEL", "SCS"), {"CLARABEL": (INACC, 0.25), "SCS": (OPT, 0.5)},
     ["CLARABEL"], (0.25, INACC), (0, 1)),
    # ... but is by another interior-point or simplex solver, whose optimum wins
    (("CLARABEL", "HIGHS"), {"CLARABEL": (INACC, 0.25), "HIGHS": (OPT, 0.5)},
     ["CLARABEL", "HIGHS"], (0.5, OPT), (1, 0)),
    # a first-order solver still rescues a solver that failed or gave nothing usable
    (("CLARABEL", "SCS"), {"CLARABEL": None, "SCS": (OPT, 0.5)},
     ["CLARABEL", "SCS"], (0.5, OPT), (1, 0)),
    (("CLARABEL", "SCS"), {"CLARABEL": ("infeasible", None), "SCS": (INACC, 0.5)},
     ["CLARABEL", "SCS"], (0.5, INACC), (1, 1)),
    (("CLARABEL", "SCS"), {"CLARABEL": (OPT, float("nan")), "SCS": (OPT, 0.5)},
     ["CLARABEL", "SCS"], (0.5, OPT), (1, 0)),
    # nothing usable anywhere
    (("CLARABEL", "SCS"), {"CLARABEL": None, "SCS": ("infeasible", None)},
     ["CLARABEL", "SCS"], (None, "failed"), (0, 0)),
])
def test_solvers_asked_and_answer_kept(solvers: tuple[str, ...], answers: dict[str, Answer],
                                       asked: list[str], kept: tuple[float | None, str],
                                       counted: tuple[int, int]) -> None:
    problem = _Scripted(answers)
    stats = LpStats()
    x, status = solve_first(problem, problem.x, solvers, stats=stats)  # type: ignore[arg-type]
    assert problem.asked == asked
    assert (None if x is None else float(x[0]), status) == kept
    # (answered by a later solver, kept though inaccurate): what a run's summary reports
    assert (stats.secondary, stats.inaccurate) == counted
    assert stats.fallbacks == 0  # the caller's to count: it knows what it falls back to
