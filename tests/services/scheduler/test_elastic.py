"""Elastic jobs (speed by GPU count from a scaling profile) and slotted re-planning."""

from __future__ import annotations

from typing import ClassVar

import pytest

import policies
from policies.base import Fitter, Plan, Policy, Replan, Snapshot
from schemas.job import JobSpec
from schemas.status import Status, StatusCode
from tests.builders import cluster, make_job, simulate
from traces import load_trace
from traces.scaling import load_scaling, with_scaling


class Widest(Policy):
    """Test policy: every job, in submit order, on the most GPUs it may use that fit."""

    name = "test-widest"
    description = "test"
    replan: ClassVar[Replan] = "event"

    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        plan = Plan()
        for job in sorted(snap.jobs.values(), key=lambda j: j.spec.submit_time_s):
            for g in reversed(job.spec.gpu_levels):
                slots = fit.try_place(job.job_id, g)
                if slots is not None:
                    plan.run[job.job_id] = slots
                    break
        return plan

    def waiting_status(self, job_id: str) -> Status:
        return Status(code=StatusCode.WAITING_FOR_GPUS, reason="test", decided_by=self.name)


class SlottedWidest(Widest):
    name = "test-slotted"
    replan: ClassVar[Replan] = "slot"


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(policies.REGISTRY, Widest.name, Widest)
    monkeypatch.setitem(policies.REGISTRY, SlottedWidest.name, SlottedWidest)


def elastic(jid: str, submit: float = 0.0) -> JobSpec:
    # 1,000 iterations; 1 it/s on 1 GPU, 3 it/s on 4 GPUs
    return make_job(jid).iterations(1000).submit(submit).scaling({1: 1.0, 2: 1.8, 4: 3.0}).build()


def test_an_elastic_job_runs_at_its_profiled_speed_for_the_gpus_it_got() -> None:
    result = simulate([elastic("a")], "test-widest", cluster(1, 4))
    [job] = result.jobs
    assert job.jct_s == pytest.approx(1000 / 3.0)
    assert result.summary["gpu_util"] == pytest.approx(1.0)


def test_rescaling_restarts_with_the_elasticflow_overhead() -> None:
    # With the elasticflow model a (re)start on 4 GPUs costs (log2 4 + 1) * 2 + 27 = 33 s
    result = simulate([elastic("a")], "test-widest", cluster(1, 4), overhead="elasticflow")
    [job] = result.jobs
    assert job.jct_s == pytest.approx(33.0 + 1000 / 3.0, rel=1e-3)


def test_levels_respect_min_and_max_gpus() -> None:
    job = elastic("a").model_copy(update={"min_gpus": 2, "max_gpus": 2})
    assert job.gpu_levels == (2,)
    assert job.iteration_time_at(2) == pytest.approx(1 / 1.8)
    assert make_job("b").gpus(2).build().gpu_levels == (2,)


def test_slotted_replanning_merges_the_events_of_a_slot() -> None:
    # Slots of 60 s counted from the last cycle (ElasticFlow): a arrives at 10 s and is planned
    # at once; b (30 s) and c (50 s) arrive within the slot and share one cycle at 70 s.
    jobs = [elastic(jid, t).model_copy(update={"max_gpus": 1})
            for jid, t in (("a", 10.0), ("b", 30.0), ("c", 50.0))]
    result = simulate(jobs, "test-slotted", cluster(1, 4))
    assert {j.job_id: j.start_s for j in result.jobs} == {"a": 10.0, "b": 70.0, "c": 70.0}
    assert result.summary["replan"] == "slot"
    faster = simulate(jobs, "test-slotted", cluster(1, 4), round_s=20.0)
    assert {j.job_id: j.start_s for j in faster.jobs} == {"a": 10.0, "b": 30.0, "c": 50.0}


def test_elasticflow_traces_get_their_scaling_profile() -> None:
    trace = load_trace("elasticflow/elasticVpollux_e")
    jobs = with_scaling(trace.jobs, load_scaling("T4"))
    assert all(j.scaling for j in jobs)
    for before, after in zip(trace.jobs, jobs, strict=True):
        # the table's speed at the requested GPUs is the trace's duration / iterations (the
        # trace rounds durations: within 3.2 %, 0.005 % for the median job)
        assert after.iteration_time_s == pytest.approx(before.iteration_time_s, rel=0.032)
        assert max(after.gpu_levels) <= min(64, after.batch_size or 64)


def test_unknown_gpu_type_is_named() -> None:
    with pytest.raises(ValueError, match=r"--gpu-type 'V100'.*A100, T4"):
        load_scaling("V100")
