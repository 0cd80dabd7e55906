"""The run-progress estimator shared by the simulated node, the scheduler and `loom status`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import progress
from domain.progress import RunProgress, attained_many, charge_many


@pytest.mark.parametrize(
    ("remaining", "last", "ready", "now", "lost", "expected"),
    [
        (100, 0, 0, 10, 0, 90),
        (100, 0, 0, 10, 4, 94),
        (100, 0, 0, 3, 4, 100),  # a short interval loses all, never negative progress
        (100, 0, 5, 10, 0, 95),  # progress only after the restart delay
    ],
)
def test_left_at(remaining: float, last: float, ready: float, now: float, lost: float,
                 expected: float) -> None:
    run = RunProgress(total=100, remaining=remaining, at=last, ready_at=ready, iteration_s=1.0)
    assert run.left_at(now, lost) == expected


SEGMENTS = ((50.0, 2.0), (80.0, 1.0), (1e18, 0.5))  # slower first, then faster


@pytest.mark.parametrize("segments", [None, SEGMENTS], ids=["flat", "segments"])
@given(done=st.floats(0, 99), ready=st.floats(0, 50), at=st.floats(0, 50),
       later=st.floats(0, 500))
def test_a_run_finishes_when_the_estimate_says(segments: tuple[tuple[float, float], ...] | None,
                                               done: float, ready: float, at: float,
                                               later: float) -> None:
    run = RunProgress(total=100, remaining=100 - done, at=at, ready_at=ready, iteration_s=2.0,
                      segments=segments)
    now = at + later
    end = run.finish_at(now)
    assert end >= max(now, ready)
    if run.left_at(now) <= 0:  # done by now, as far as the estimate goes
        assert end == max(now, ready)
        return
    assert run.left_at(end) == pytest.approx(0.0, abs=1e-6)
    # Asking later changes nothing while nothing interrupts the run.
    assert run.finish_at(now + (end - now) / 2) == pytest.approx(end)


def test_accounting_up_to_now_then_asking_gives_the_same_end() -> None:
    run = RunProgress(total=100, remaining=100, at=0.0, ready_at=10.0, iteration_s=1.0)
    asked = run.finish_at(30.0)
    run.advance(30.0, 0.0)
    assert run.remaining == 80 and run.finish_at(30.0) == asked == 110.0


@pytest.mark.parametrize("segments", [None, SEGMENTS], ids=["flat", "segments"])
@given(remaining=st.floats(0, 100), at=st.floats(0, 50), ready=st.floats(0, 100),
       gaps=st.lists(st.floats(0, 200), max_size=8), start=st.integers(0, 3),
       lost=st.floats(0, 60), iteration_s=st.floats(0.01, 10))
def test_charging_cycles_late_is_advancing_at_each_bit_for_bit(
        segments: tuple[tuple[float, float], ...] | None, remaining: float, at: float,
        ready: float, gaps: list[float], start: int, lost: float, iteration_s: float) -> None:
    """`charge` gives exactly the floats of `advance` at each cycle in turn (nodes and the
    scheduler charge cycles late, and a simulation's decisions depend on the last bit)."""
    def fresh() -> RunProgress:
        return RunProgress(total=100, remaining=remaining, at=at, ready_at=ready,
                           iteration_s=iteration_s, segments=segments)

    times = [at + sum(gaps[:i + 1]) for i in range(len(gaps))]
    one_by_one, late = fresh(), fresh()
    for now in times[start:]:
        one_by_one.advance(now, lost)
    late.charge(times, start, lost)
    assert (late.remaining, late.at) == (one_by_one.remaining, one_by_one.at)


_runs = st.lists(st.tuples(st.floats(0, 100), st.floats(0, 50), st.floats(0, 100),
                           st.floats(0, 60), st.floats(0.01, 10), st.integers(0, 9),
                           st.booleans()), min_size=1, max_size=12)


@pytest.mark.parametrize("batch_min", [0, 10**9], ids=["arrays", "loop"])
@given(runs=_runs, gaps=st.lists(st.floats(0, 200), min_size=1, max_size=8))
def test_charging_many_runs_at_once_is_charging_each_bit_for_bit(
        batch_min: int, runs: list[tuple[float, float, float, float, float, int, bool]],
        gaps: list[float]) -> None:
    """`charge_many` (arrays, past `_BATCH_MIN` charges) and `attained_many` give each run
    exactly the floats of charging it alone, whatever cycle it starts at (some past the
    log's end), with or without progress-dependent speed."""
    def fresh(row: tuple[float, float, float, float, float, int, bool]) -> RunProgress:
        remaining, at, ready, lost, per, _, segmented = row
        return RunProgress(total=100, remaining=remaining, at=at, ready_at=ready,
                           iteration_s=per, per_event_s=lost,
                           segments=SEGMENTS if segmented else None)

    first = max(row[1] for row in runs)
    times = [first + sum(gaps[:i + 1]) for i in range(len(gaps))]
    alone, batched = [fresh(row) for row in runs], [fresh(row) for row in runs]
    for run, row in zip(alone, runs, strict=True):
        run.charge(times, row[5], run.per_event_s)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(progress, "_BATCH_MIN", batch_min)
        charge_many([(run, row[5]) for run, row in zip(batched, runs, strict=True)], times)
        sums = attained_many([(row[1] / 3, row[1], row[5]) for row in runs], times)
    assert [(r.remaining, r.at) for r in batched] == [(r.remaining, r.at) for r in alone]
    expected = []
    for row in runs:
        total, last = row[1] / 3, row[1]
        for now in times[row[5]:]:
            total += now - last
            last = now
        expected.append(total)
    assert sums == expected
