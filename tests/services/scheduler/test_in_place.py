"""Cycles planned in place (services/scheduler/core.py, `Policy.running_stays` and
`Policy.plan_in_place`) decide exactly what the full walk over running jobs decides: the same
runs with and without them, bit for bit.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import RunningJobs
from policies.mechanisms.bounds import RunningBounds
from policies.mechanisms.ordered import OrderedPolicy
from policies.tiresias import DiscretisedLas
from schemas.job import JobSpec
from tests.builders import cluster, make_job, simulate

ORDERED = ("fifo", "srtf", "srsf", "tiresias", "las")

traces = st.lists(
    st.tuples(st.sampled_from([1, 1, 2, 4, 8, 16]),  # GPUs (16: two whole nodes)
              st.integers(1, 4000),  # seconds of work: long enough for Tiresias' demotions
              st.integers(0, 3000)),  # submission
    min_size=1, max_size=60)


def _jobs(rows: list[tuple[int, int, int]]) -> list[JobSpec]:
    return [make_job(f"j{i:02d}").gpus(g).runs_for(s).submit(t).build()
            for i, (g, s, t) in enumerate(rows)]


def _run(jobs: list[JobSpec], policy: str, nodes: int, overhead: str,
         lazy_from: int = 1) -> tuple[object, ...]:
    """The run's figures, with running jobs' views made when read and the last running rank
    bounded from `lazy_from` running jobs (the defaults count in dozens: these clusters are
    small)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr("services.scheduler.core.LAZY_VIEWS_FROM", lazy_from)
        out = simulate(jobs, policy, cluster(nodes, 8, switches=nodes // 2 or 1),
                       overhead=overhead)
    s = out.summary
    return s["decision_digest"], s["events"], s["cycles"], s["avg_jct_s"]


@settings(max_examples=80, deadline=None)
@given(rows=traces, policy=st.sampled_from(ORDERED), nodes=st.sampled_from([2, 4]),
       overhead=st.sampled_from(["none", "muri"]), lazy_from=st.sampled_from([1, 4, 64]))
def test_in_place_cycles_decide_as_the_full_walk(
        rows: list[tuple[int, int, int]], policy: str, nodes: int, overhead: str,
        lazy_from: int) -> None:
    jobs = _jobs(rows)
    assert _run(jobs, policy, nodes, overhead, lazy_from) == _full(jobs, policy, nodes,
                                                                   overhead)


def _full(jobs: list[JobSpec], policy: str, nodes: int, overhead: str) -> tuple[object, ...]:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(OrderedPolicy, "running_stays", lambda self, snap: False)
        m.setattr(OrderedPolicy, "tries_in_place", False)
        return _run(jobs, policy, nodes, overhead, lazy_from=1 << 30)  # views made eagerly


@pytest.mark.parametrize("policy", ORDERED)
def test_in_place_cycles_decide_as_the_full_walk_on_busy_traces(policy: str) -> None:
    """Seeded traces of 60 jobs, long enough for demotions and queues: the jobs that start in
    place must get ranks that order them as the full walk would (Tiresias), and the bound on
    the last running job's rank must never fall below it (fifo, srtf, srsf)."""
    for seed in range(12 if policy in ("tiresias", "las") else 6):
        rng = random.Random(seed)
        rows = [(rng.choice([1, 1, 2, 4, 8, 16]), rng.randint(1, 4000), rng.randint(0, 3000))
                for _ in range(60)]
        jobs = _jobs(rows)
        nodes = rng.choice([2, 4])
        assert _run(jobs, policy, nodes, "muri") == _full(jobs, policy, nodes, "muri"), seed


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per full walk (each asks for the running jobs' sorted ranks)."""
    walked: list[int] = []
    original = OrderedPolicy.running_keys

    def counting(self: OrderedPolicy, snap: object) -> object:
        walked.append(1)
        return original(self, snap)  # type: ignore[arg-type]

    monkeypatch.setattr(OrderedPolicy, "running_keys", counting)
    return walked


# Jobs that each find free GPUs.
QUIET = [make_job(f"j{i}").runs_for(100).submit(10 * i).build() for i in range(8)]
# Shorter jobs arrive while a long one runs (each ranks ahead of it under srtf) and find free
# GPUs beside it.
OVERTAKE_BESIDE = [make_job("long").gpus(4).runs_for(10_000).submit(0).build(), *(
    make_job(f"short{i}").gpus(2).runs_for(50).submit(10 + 100 * i).build() for i in range(6))]
# A wide job ranks ahead of a long one but finds no room even in its GPUs (a shorter job holds
# the rest), while small jobs that overtake both keep arriving and fit beside them; once the
# short job ends, the wide one displaces the long one (the one walk).
BLOCKED_WIDE = [make_job("short").gpus(8).runs_for(3000).submit(0).build(),
                make_job("long").gpus(4).runs_for(10_000).submit(0).build(),
                make_job("wide").gpus(16).runs_for(4000).submit(10).build(), *(
                    make_job(f"tiny{i}").runs_for(50).submit(100 + 100 * i).build()
                    for i in range(6))]
# A short job that only fits by preempting the long one.
OVERTAKE_DISPLACING = [make_job("long").gpus(8).runs_for(10_000).submit(0).build(),
                       make_job("short").gpus(8).runs_for(50).submit(10).build()]


@pytest.mark.parametrize(("jobs", "nodes", "preemptions", "walked"), [
    pytest.param(QUIET, 2, 0, 0, id="quiet-cluster-in-place"),
    pytest.param(OVERTAKE_BESIDE, 2, 0, 0, id="overtakers-beside-running-in-place"),
    pytest.param(BLOCKED_WIDE, 2, 1, 1, id="overtakers-past-a-blocked-wide-job-in-place"),
    pytest.param(OVERTAKE_DISPLACING, 1, 1, 1, id="overtaker-that-displaces-walks"),
])
def test_which_cycles_walk_the_running_jobs(walks: list[int], jobs: list[JobSpec], nodes: int,
                                            preemptions: int, walked: int) -> None:
    out = simulate(jobs, "srtf", cluster(nodes, 8))
    assert out.summary["finished"] == len(jobs)
    assert out.summary["preemptions"] == preemptions
    assert len(walks) == walked




def _synced_exactly(rows: list[tuple[int, int, int]], policy: str, nodes: int) -> int:
    """Runs the trace, checking at every sync that the running jobs' bounds and Tiresias'
    predicted crossings hold no job that no longer runs, and after it exactly the running
    jobs; returns how many syncs it checked. Both are synced by count alone
    (`RunningBounds.take_reports`, `DiscretisedLas._kept`), exact only while the first
    holds. (A failure inside a cycle is logged and the run goes on: collected, then
    asserted.)"""
    checked, wrong = 0, []
    take_reports, kept = RunningBounds.take_reports, DiscretisedLas._kept

    def check(what: str, held: set[str], running: RunningJobs, after: bool) -> None:
        nonlocal checked
        ids = set(running.ids)
        ok = held == ids if after else held <= ids
        if not ok:
            wrong.append((what, sorted(held ^ ids), after))
        checked += 1

    def reports_checked(self: RunningBounds, running: RunningJobs, key_of: object) -> None:
        check("bounds", set(self.keys()), running, False)
        take_reports(self, running, key_of)  # type: ignore[arg-type]
        check("bounds", set(self.keys()), running, True)

    def kept_checked(self: DiscretisedLas, snap: object, running: RunningJobs) -> None:
        check("crossings", set(self._due), running, False)
        kept(self, snap, running)  # type: ignore[arg-type]
        check("crossings", set(self._due), running, True)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(RunningBounds, "take_reports", reports_checked)
        m.setattr(DiscretisedLas, "_kept", kept_checked)
        _run(_jobs(rows), policy, nodes, "muri")
    assert not wrong
    return checked

@settings(max_examples=40, deadline=None)
@given(rows=traces, policy=st.sampled_from(["srtf", "tiresias", "las"]),
       nodes=st.sampled_from([2, 4]))
def test_bounds_and_predicted_crossings_hold_exactly_the_running_jobs(
        rows: list[tuple[int, int, int]], policy: str, nodes: int) -> None:
    _synced_exactly(rows, policy, nodes)


@pytest.mark.parametrize("policy", ["srtf", "tiresias", "las"])
def test_bounds_and_predicted_crossings_are_checked_on_busy_traces(policy: str) -> None:
    rng = random.Random(7)
    rows = [(rng.choice([1, 1, 2, 4, 8, 16]), rng.randint(1, 4000), rng.randint(0, 3000))
            for _ in range(60)]
    assert _synced_exactly(rows, policy, 2) > 20
