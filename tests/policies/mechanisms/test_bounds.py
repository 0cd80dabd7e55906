"""Running jobs' keys as last taken (`RunningBounds`), driven without a policy: keys are
plain numbers, and a job's true key now is its bound less what it has run since."""

from __future__ import annotations

from collections.abc import Collection

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from policies.base import RunningJobs
from policies.mechanisms import bounds
from policies.mechanisms.bounds import Key, Rank, RunningBounds


def rank(seconds: float, job_id: str) -> Rank:
    return ((seconds,), job_id)


def running(ids: Collection[str], reported: Collection[str] = ()) -> RunningJobs:
    """A snapshot's running jobs, as the scheduler hands them to a policy (no views read)."""
    return RunningJobs(dict.fromkeys(ids).keys(), tuple, reported)


class KeysNow:
    """Every running job's true key now; counts which were read."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.read: list[str] = []

    def __call__(self, job_id: str) -> Key:
        self.read.append(job_id)
        return (self.seconds[job_id],)


@pytest.mark.parametrize(("steps", "ranks", "untaken"), [
    pytest.param([("take", "a", 5.0), ("take", "b", 3.0)], [rank(3, "b"), rank(5, "a")], [],
                 id="taken-sorted"),
    pytest.param([("take", "a", 5.0), ("take", "a", 2.0)], [rank(2, "a")], [],
                 id="taken-again-replaces"),
    pytest.param([("take", "a", 5.0), ("drop", "a", 0.0), ("drop", "z", 0.0)], [], [],
                 id="dropped-even-unknown"),
    pytest.param([("to_take", "a", 0.0), ("take", "b", 1.0)], [rank(1, "b")], ["a"],
                 id="to-take-unranked"),
    pytest.param([("take", "a", 5.0), ("to_take", "a", 0.0)], [], ["a"],
                 id="to-take-unranks"),
])
def test_bounds_follow_takes_and_drops(steps: list[tuple[str, str, float]], ranks: list[Rank],
                                       untaken: list[str]) -> None:
    b = RunningBounds()
    for op, job_id, seconds in steps:
        if op == "take":
            b.take(job_id, (seconds,))
        else:
            getattr(b, op)(job_id)
    assert b.ranks() == ranks
    assert [jid for jid, k in b.keys().items() if k is None] == untaken


def test_reports_are_taken_once_per_snapshot() -> None:
    """The jobs to take and those reported on are read at the first check of a snapshot;
    another check of the same snapshot reads none, the next snapshot's reports again."""
    b = RunningBounds()
    b.take("a", (9.0,))
    b.to_take("b")
    now = KeysNow({"a": 4.0, "b": 6.0})
    snap = running(["a", "b"], reported=["a"])
    b.take_reports(snap, now)
    b.take_reports(snap, now)
    assert sorted(now.read) == ["a", "b"]
    assert b.ranks() == [rank(4, "a"), rank(6, "b")]
    b.take_reports(running(["a", "b"]), now)
    assert sorted(now.read) == ["a", "b"]  # nothing to take, nothing reported


def test_bounds_not_told_of_a_start_take_every_running_job() -> None:
    """Bounds that missed a start or an end (a policy switched to mid-run) take every
    running job's key afresh, and forget jobs no longer running."""
    b = RunningBounds()
    b.take("gone", (1.0,))
    now = KeysNow({"a": 4.0, "b": 6.0})
    b.take_reports(running(["a", "b"]), now)
    assert b.ranks() == [rank(4, "a"), rank(6, "b")]
    assert "gone" not in b


@pytest.mark.parametrize("rebuild_from", [0, 1 << 20], ids=["one-by-one", "rebuilt"])
def test_a_walk_retakes_many_keys_at_once_as_one_by_one(monkeypatch: pytest.MonkeyPatch,
                                                        rebuild_from: int) -> None:
    """The keys a full walk took anew (those that still run) and dropped (those it
    preempted) leave the same bounds, set one by one or in one rebuild."""
    monkeypatch.setattr(bounds, "_REBUILD_FROM", rebuild_from)
    b = RunningBounds()
    b.reset([rank(float(i), f"j{i}") for i in range(40)])
    walked = sorted(rank(i / 2, f"j{i}") for i in range(10, 40, 3))
    run = {jid for _, jid in walked[::2]}
    b.retake(walked, run)
    expected = sorted([rank(float(i), f"j{i}") for i in range(40) if i < 10 or (i - 10) % 3]
                      + [item for item in walked if item[1] in run])
    assert b.ranks() == expected
    assert b.keys() == {jid: k for k, jid in expected}


@pytest.mark.parametrize(("first", "reaching", "behind"), [
    pytest.param(rank(0, "x"), ["a", "b", "c"], ["a", "b", "c"], id="ahead-of-all"),
    pytest.param(rank(5, "b"), ["b", "c"], ["c"], id="at-one"),
    pytest.param(rank(9, "x"), [], [], id="behind-all"),
])
def test_the_jobs_a_waiting_rank_may_overtake(first: Rank, reaching: list[str],
                                             behind: list[str]) -> None:
    b = RunningBounds()
    b.reset([rank(1, "a"), rank(5, "b"), rank(8, "c")])
    assert list(b.reaching(first)) == reaching
    assert list(b.behind(first)) == behind


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(100, 400), st.integers(0, 150)), min_size=1,
                max_size=20),
       st.lists(st.lists(st.integers(1, 450), max_size=5), max_size=3))
def test_the_last_rank_compares_with_every_waiting_job_as_the_true_last(
        taken: list[tuple[int, int]], waiting: list[list[int]]) -> None:
    """Keys taken earlier, each job having run some seconds since (its true key is lower):
    the rank `last` gives sits ahead of and behind the same waiting jobs as the true last
    running rank, and no more keys are read than the loop's cap."""
    b = RunningBounds()
    b.reset([rank(float(s), f"r{i}") for i, (s, _) in enumerate(taken)])
    now = KeysNow({f"r{i}": float(s - ran) for i, (s, ran) in enumerate(taken)})
    queues = [SortedList(rank(float(s), f"w{q}-{i}") for i, s in enumerate(seconds))
              for q, seconds in enumerate(waiting)]
    used = b.last([q for q in queues if q], now)
    true_last = max(rank(s, jid) for jid, s in now.seconds.items())
    for queue in queues:
        for item in queue:
            assert (used < item) == (true_last < item), item
    assert len(now.read) <= bounds._RETAKES
    # Keys read are now exact: the bounds never rank a job ahead of its true key.
    for (k,), jid in b.ranks():
        assert k >= now.seconds[jid]
