"""bench/queues.py's pure parts on a tiny hand-made log: holdings per queue over time, the
episodes in which a queue is owed GPUs, and what the bench reports of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from schemas.job import JobState

REPO = Path(__file__).resolve().parents[2]
Q, R, P, F = JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED, JobState.FINISHED


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_queues", REPO / "bench" / "queues.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def changes(bench: ModuleType) -> list:  # type: ignore[type-arg]
    """Queue a (nominal 4) borrows all 8 GPUs; b (nominal 4) waits 30 s for its 2-GPU job, then
    a 4-GPU job of b, too wide for b's 2 idle GPUs of quota, is owed nothing."""
    c = bench.Change
    return [
        c(0.0, "a1", Q, 0), c(0.0, "a1", R, 4), c(0.0, "a2", Q, 0), c(0.0, "a2", R, 4),
        c(10.0, "b1", Q, 0),  # b owed from 10: holds 0 of 4, a 2-GPU job waits
        c(40.0, "a2", P, 0), c(40.0, "b1", R, 2),  # reclaim and start, one instant
        c(50.0, "b2", Q, 0),  # 4 GPUs: no room in b's quota (2 left): not owed
        c(60.0, "a1", F, 0), c(60.0, "b2", R, 4),
        c(70.0, "a3", Q, 0),  # a holds 0 of 4 from 60 (a2 waits): owed until the log ends
        c(90.0, "b1", F, 0),
    ]


QUEUE_OF = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b"}
SIZE_OF = {"a1": 4, "a2": 4, "a3": 2, "b1": 2, "b2": 4}
NOMINAL = {"a": 4, "b": 4}


def test_holdings_over_time(bench: ModuleType) -> None:
    series, _ = bench.measure(changes(bench), QUEUE_OF, SIZE_OF, NOMINAL, 8)
    assert series == {"a": [(0.0, 8), (40.0, 4), (60.0, 0)],
                      "b": [(0.0, 0), (40.0, 2), (60.0, 6), (90.0, 4)]}


def test_owed_episodes(bench: ModuleType) -> None:
    _, episodes = bench.measure(changes(bench), QUEUE_OF, SIZE_OF, NOMINAL, 8)
    E = bench.Episode
    assert episodes == [
        E("b", 10.0, 40.0, True, idle=0, need=2),   # the cluster full: reclaim's part
        E("a", 60.0, 90.0, False, idle=2, need=4),  # a2 waits with 2 GPUs idle, open at the end
    ]
    assert [e.duration for e in episodes] == [30.0, 30.0]


def test_recovery_against_the_bound(bench: ModuleType) -> None:
    _, episodes = bench.measure(changes(bench), QUEUE_OF, SIZE_OF, NOMINAL, 8)
    rec = bench.recovery(episodes, 0.0)
    assert (rec["episodes"], rec["max_s"], rec["p99_s"], rec["owed_s"]) == (2, 30.0, 30.0, 60.0)
    assert (rec["over_bound"], rec["over_bound_idle"], rec["open"]) == (2, 0, 1)
    assert rec["worst"]["queue"] == "b"
    assert bench.recovery(episodes, 30.0)["over_bound"] == 0
    assert bench.recovery([], 0.0)["max_s"] == 0.0


def test_an_instant_reclaim_is_no_episode(bench: ModuleType) -> None:
    c = bench.Change
    log = [c(0.0, "a1", R, 4), c(0.0, "a2", R, 4),
           c(5.0, "b1", Q, 0), c(5.0, "a2", P, 0), c(5.0, "b1", R, 2)]
    _, episodes = bench.measure(log, QUEUE_OF, SIZE_OF, NOMINAL, 8)
    assert episodes == []


def test_nearest_rank_and_split(bench: ModuleType) -> None:
    assert bench.nearest_rank([float(i) for i in range(1, 101)], 99) == 99.0
    assert bench.nearest_rank([3.0, 1.0, 2.0], 99) == 3.0
    assert bench.nearest_rank([], 99) == 0.0
    assert bench.split_nominal(64, [2, 1, 1]) == {"a": 32, "b": 16, "c": 16}
    assert bench.split_nominal(10, [1, 1, 1]) == {"a": 4, "b": 3, "c": 3}
    with pytest.raises(ValueError):
        bench.split_nominal(10, [1, 1])


def test_jobs_are_dealt_by_submission_order(bench: ModuleType) -> None:
    from tests.builders import make_job

    jobs = [make_job(f"j{i}").build() for i in range(5)]
    assert [j.tenant for j in bench.dealt(jobs)] == ["a", "b", "c", "a", "b"]
    config = bench.parse_tenants(bench.queue_file({"a": 2, "b": 1, "c": 1}), "q.toml")
    assert {q: s.nominal for q, s in config.queues.items()} == {"a": 2, "b": 1, "c": 1}
    assert "[queues.a]" in bench.to_toml(bench.queue_file({"a": 2}))


def test_the_plot_is_written(bench: ModuleType, tmp_path: Path) -> None:
    series, _ = bench.measure(changes(bench), QUEUE_OF, SIZE_OF, NOMINAL, 8)
    grid = {"fifo": {"without queues": series, "with queues": series}}
    path = bench.plot_shares(grid, NOMINAL, 100.0, tmp_path / "shares.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
