"""What every LP-based policy shares: problem sizes, a compile cache, solver statistics.

cvxpy compiles a problem once per shape; with every number a `cp.Parameter` (DPP) a re-plan only
re-solves, up to `DPP_ROWS_MAX` rows (past it the compiled form costs more than it saves).
Shapes are bucketed so that a queue growing by one job does not recompile: sizes are exact up
to 16, then rounded up to 4 significant bits (≤ 12.5 % padding), or for problems whose
compilation dominates (Gavel's, compiled at many sizes in one run), powers of two. Each policy
pads its own way, so that padding rows never bind.

`solve_first` hands back solutions snapped to a grid of 1e-6 (`snap`): what lies below the
solvers' tolerance must not reach a decision (docs/replay.md, "Solvers and determinism").
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:  # cvxpy costs about a second to import: only on first use
    import cvxpy as cp

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
# Past this many rows a problem is solved without DPP (cvxpy reads its Parameters as
# constants and canonicalises afresh): the compiled form grows with the square of the rows
# (Gavel's max-min LP at 8,192 rows: 4.8 GB and 16 s; finish-time fairness at 4,096: 5.5 GB),
# a plain canonicalisation linearly (16,384 rows: about 1 s and 0.1 GB).
DPP_ROWS_MAX = 2048
USABLE = ("optimal", "optimal_inaccurate")
# First-order solvers: their tolerances (SCS: 1e-4) are no tighter than an interior-point
# solver's "optimal_inaccurate" answer, so they are tried only where no answer is in hand.
FIRST_ORDER = frozenset({"SCS"})
# Solutions are rounded to this many decimals before any decision sees them. The solvers stop
# at tolerances near 1e-8, so digits below 1e-6 are noise: the same optimum from another
# solver version, or two symmetric jobs' shares, differ there; and an interior-point solver
# leaves ±1e-10 where the optimum is 0, which a share > 0 test would read as a share.
SHARE_DECIMALS = 6


def snap(x: FloatArray, decimals: int = SHARE_DECIMALS) -> FloatArray:
    """`x` rounded to `decimals` (and -0.0 made 0.0), so values within solver tolerance of
    each other compare equal and ties reach the callers' deterministic tie-breaks."""
    out: FloatArray = np.round(x, decimals) + 0.0
    return out


def bucket(n: int, bits: int = 4) -> int:
    """Compiled-problem size for n jobs: n up to 2^bits, else n rounded up to `bits`
    significant bits (bits=1: the next power of two, for problems that compile slowly)."""
    if n <= 1 << bits:
        return n
    step = 1 << (n.bit_length() - bits)
    return -(-n // step) * step


@dataclass(slots=True)
class LpStats:
    solves: int = 0
    compiles: int = 0
    cache_hits: int = 0
    fallbacks: int = 0  # cycles where no solver produced a solution
    exact: int = 0  # cycles where the first solve failed and a closed form was used
    rescaled: int = 0  # cycles solved by the first solver only on the scaled data
    secondary: int = 0  # solutions that only a later solver found
    inaccurate: int = 0  # solutions kept though "optimal_inaccurate" (still used)
    total_s: float = 0.0  # wall time in `solve`: compiles and cvxpy's first import included
    max_s: float = 0.0

    @property
    def mean_s(self) -> float:
        return self.total_s / self.solves if self.solves else 0.0

    def timed(self, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.solves += 1
        self.total_s += dt
        self.max_s = max(self.max_s, dt)


def as_summary(stats: Any) -> dict[str, float | int]:
    """A solver statistics dataclass (`LpStats`, Chronus' `MilpStats`) as a run's summary
    reports it: its counts, and its seconds to the microsecond."""
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(stats).items()}


P = TypeVar("P")


@dataclass
class CompiledCache(Generic[P]):
    """Compiled problems by shape; `build(shape)` makes one (a problem plus its handles)."""

    build: Callable[[tuple[int, ...]], P]
    stats: LpStats = field(default_factory=LpStats)
    _cache: dict[tuple[int, ...], P] = field(default_factory=dict)

    def get(self, shape: tuple[int, ...]) -> P:
        hit = self._cache.get(shape)
        if hit is not None:
            self.stats.cache_hits += 1
            return hit
        self.stats.compiles += 1
        made = self._cache[shape] = self.build(shape)
        return made

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledCache[P]:
        """A copy (in a forecast's fork of the policy) compiles its own problems and counts
        its own solves: a compiled problem holds its solver's native handles, which cannot be
        copied, and sharing one would let the copy's solves warm-start the original's."""
        return CompiledCache(self.build)


def compiles(rows: int) -> bool:
    """Whether a problem of `rows` rows is solved through its compiled (DPP) form."""
    return rows <= DPP_ROWS_MAX


def solve_first(problem: cp.Problem, variable: cp.Variable, solvers: Sequence[str], *,
                rows: int = 0, stats: LpStats | None = None) -> tuple[FloatArray | None, str]:
    """Solve with each solver in turn; the first optimal value (or the first inaccurate one),
    snapped to the share grid (`snap`). A first-order solver (`FIRST_ORDER`) is tried only
    where no inaccurate answer is in hand. A problem of more than `DPP_ROWS_MAX` rows is
    solved without its compiled form. `stats` counts an answer kept from a later solver
    (`secondary`) or an inaccurate one (`inaccurate`)."""
    x, status, by = _first_answer(problem, variable, solvers, not compiles(rows))
    if stats is not None and x is not None:
        stats.secondary += by > 0
        stats.inaccurate += status != "optimal"
    return x, status


def _first_answer(problem: cp.Problem, variable: cp.Variable, solvers: Sequence[str],
                  plain: bool) -> tuple[FloatArray | None, str, int]:
    """`solve_first`'s answer and the position of the solver that gave it."""
    from cvxpy.error import SolverError

    backup: tuple[FloatArray | None, str, int] = (None, "failed", -1)
    for i, solver in enumerate(solvers):
        if solver in FIRST_ORDER and backup[0] is not None:
            continue
        try:
            with warnings.catch_warnings():  # "may be inaccurate": reported in the status
                warnings.simplefilter("ignore", UserWarning)
                problem.solve(solver=solver, warm_start=False,  # type: ignore[no-untyped-call]
                              ignore_dpp=plain)
        except SolverError:
            continue
        value, status = variable.value, str(problem.status)
        if status not in USABLE or value is None or not np.all(np.isfinite(value)):
            continue
        if status == "optimal":
            return snap(np.asarray(value, dtype=np.float64)), status, i
        if backup[0] is None:
            backup = (snap(np.asarray(value, dtype=np.float64)), status, i)
    return backup
