"""The run-progress estimator shared by the simulated node, the scheduler and `loom status`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.progress import RunProgress


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
