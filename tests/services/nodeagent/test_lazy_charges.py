"""Simulated nodes charge cycles lazily (services/nodeagent/simnode.py), in one fleet that takes
each cycle once (services/nodeagent/simfleet.py), and decide exactly as nodes that charge every
run at every cycle: the same runs, bit for bit, with jobs that finish at one instant (copies
of one job, launched together) finishing in the same order."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.job import JobSpec
from services.nodeagent import simfleet
from services.nodeagent.simfleet import SimFleetCore
from services.runtime.effects import PRIORITY_INPUT, Effect, SetTimers
from tests.builders import cluster, simulate
from tests.services.nodeagent import sim_traces


def _run(jobs: list[JobSpec], policy: str, nodes: int) -> tuple[object, ...]:
    out = simulate(jobs, policy, cluster(nodes, 8, switches=nodes // 2 or 1), overhead="muri")
    s = out.summary
    return s["decision_digest"], s["events"], s["cycles"], s["avg_jct_s"]


def _eager_cycle(self: SimFleetCore, now: float) -> list[Effect]:
    """The nodes as they were: every charged run advanced and its timer moved, at every
    cycle, node by node."""
    timers: list[tuple[Hashable, float]] = []
    for node in self.members:
        for run in node.jobs.values():
            progress = run.progress
            if run.leader and progress.per_event_s:
                progress.advance(now, progress.per_event_s)
                timers.append((run.key, progress.finish_at(now, run.fail_at)))
    return [SetTimers(timers, PRIORITY_INPUT)] if timers else []


def _eager(jobs: list[JobSpec], policy: str, nodes: int) -> tuple[object, ...]:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(SimFleetCore, "_on_cycle", _eager_cycle)
        return _run(jobs, policy, nodes)


@settings(max_examples=40, deadline=None)
@given(rows=sim_traces.rows(), policy=st.sampled_from(["srtf", "tiresias", "muri-s"]),
       nodes=st.sampled_from([1, 2, 4]), catch_up=st.sampled_from([2, 5, 64]))
def test_lazy_charges_decide_as_eager_ones(rows: list[sim_traces.Row], policy: str,
                                           nodes: int, catch_up: int) -> None:
    jobs = sim_traces.jobs(rows)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(simfleet, "CATCH_UP_CYCLES", catch_up)
        lazy = _run(jobs, policy, nodes)
    assert lazy == _eager(jobs, policy, nodes)
