"""A scheduler rebuilt from its recorded decisions (`services.scheduler.recovery`) holds the
same job table as the one that made them, and decides the same next cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from schemas import subjects
from schemas.events import JobFinished, JobTransition, PlanDecided, envelope
from schemas.job import JobSpec, JobState, SubmitJob
from schemas.tenants import TenantsConfig, parse_tenants
from services.runtime.effects import Effect, Publish, SetTimer
from services.runtime.service import Recorded
from services.scheduler.build import build_scheduler
from services.scheduler.core import SchedulerCore
from services.scheduler.recovery import HISTORY
from tests.builders import cluster, make_job

RECORDED = set(HISTORY)


@dataclass
class Run:
    """Drives a scheduler core by hand and records what it publishes, as the stream would."""

    core: SchedulerCore
    stream: list[Recorded] = field(default_factory=list)

    def _take(self, effects: list[Effect], now: float) -> list[Effect]:
        for eff in effects:
            if isinstance(eff, Publish) and eff.subject in RECORDED:
                env = envelope(eff.body, event_id=f"e{len(self.stream)}", occurred_at=now,
                               producer="scheduler", causation_id=None)
                self.stream.append(Recorded(len(self.stream) + 1, eff.subject, env))
        return effects

    def submit(self, spec: JobSpec, now: float) -> None:
        env = envelope(SubmitJob.from_spec(spec), event_id=f"s-{spec.job_id}", occurred_at=now,
                       producer="user", causation_id=None)
        self._take(self.core.handle(env, now), now)

    def finish(self, job_id: str, now: float) -> None:
        rec = self.core.jobs[job_id]
        env = envelope(JobFinished(job_id=job_id, node_id=rec.placement[0][0],
                                   iterations_done=float(rec.spec.iterations)),
                       event_id=f"f-{job_id}", occurred_at=now, producer="n", causation_id=None)
        self._take(self.core.handle(env, now), now)

    def cycle(self, now: float) -> PlanDecided | None:
        out = self._take(self.core.on_timer("cycle", now), now)
        plans = [e.body for e in out if isinstance(e, Publish) and isinstance(e.body, PlanDecided)]
        return plans[0] if plans else None


def table(core: SchedulerCore) -> dict[str, tuple[object, ...]]:
    """What the scheduler knows of each job; a running job's progress is an estimate brought
    up to date at each cycle, so it is compared after one."""
    return {jid: (r.state, r.placement, r.preemptions, r.started_at, r.ended_at,
                  None if r.state is JobState.RUNNING else r.iterations_done)
            for jid, r in core.jobs.items()}


def progress(core: SchedulerCore) -> dict[str, float]:
    return {jid: round(r.iterations_done, 6) for jid, r in core.jobs.items()}


QUEUES = parse_tenants({
    "cohorts": {"lab": {"half_life_s": 50}},
    "queues": {"a": {"cohort": "lab", "tenants": ["a"], "nominal": 6},
               "b": {"cohort": "lab", "tenants": ["b"], "nominal": 2}},
}, "queues.toml")


def history(policy: str, tenants: TenantsConfig | None = None) -> Run:
    run = Run(build_scheduler(policy, cluster(2, 4), tenants=tenants))
    for i, gpus in enumerate((4, 2, 2, 4, 1, 8)):
        run.submit(make_job(f"j{i}").gpus(gpus).runs_for(100 * (6 - i)).submit(i)
                   .tenant("ab"[i % 2]).build(), float(i))
    run.cycle(5.0)
    run.submit(make_job("late").gpus(1).runs_for(10).submit(20).build(), 20.0)  # may preempt
    run.cycle(20.0)
    run.finish(min(j for j, r in run.core.jobs.items() if r.state is JobState.RUNNING), 30.0)
    run.cycle(30.0)
    return run


@pytest.mark.parametrize("policy", ["fifo", "srtf", "tiresias"])
def test_rebuilt_table_and_next_decision_match(policy: str) -> None:
    run = history(policy)
    fresh = build_scheduler(policy, cluster(2, 4))
    effects = fresh.rebuild(run.stream, 40.0)
    assert table(fresh) == table(run.core)
    assert fresh.cycle == run.core.cycle
    assert [e for e in effects if isinstance(e, SetTimer)] == [SetTimer("cycle", 40.0, 10)]

    # Both finish the same job and plan the next cycle: the same launches and stops.
    running = sorted(j for j, r in run.core.jobs.items() if r.state is JobState.RUNNING)
    node = run.core.jobs[running[0]].placement[0][0]
    for core in (run.core, fresh):
        core.handle(envelope(JobFinished(job_id=running[0], node_id=node,
                                         iterations_done=1.0), event_id="f", occurred_at=40.0,
                             producer="n", causation_id=None), 40.0)
    again = Run(fresh)
    original, rebuilt = run.cycle(40.0), again.cycle(40.0)
    assert rebuilt == original
    assert table(fresh) == table(run.core)
    assert progress(fresh) == progress(run.core)


@pytest.mark.parametrize("policy", ["fifo", "srtf"])
def test_a_rebuilt_scheduler_recomputes_the_queues_decayed_usage(policy: str) -> None:
    """Fair share survives a crash or failover: the usage a rebuilt scheduler computes from
    the recorded runs is the one the scheduler it replaces had, brought to the same time."""
    run = history(policy, QUEUES)
    fresh = build_scheduler(policy, cluster(2, 4), tenants=QUEUES)
    fresh.rebuild(run.stream, 40.0)
    layer, rebuilt = run.core.admission.queues, fresh.admission.queues  # type: ignore[union-attr]
    assert layer is not None and rebuilt is not None and layer._last is not None
    expected = layer.usage.advance(40.0, layer._last.reserved, layer.book.half_life_s)
    assert set(rebuilt.usage.gpu_s) == {"a", "b"} and rebuilt.usage.at == 40.0
    for queue in ("a", "b"):
        assert rebuilt.usage.of(queue) > 0
        assert rebuilt.usage.of(queue) == pytest.approx(expected.of(queue), rel=1e-9)


def test_a_plan_stored_without_its_transitions_is_repaired() -> None:
    run = history("fifo")
    cut = max(r.seq for r in run.stream if isinstance(r.env.body, PlanDecided))
    plan = run.stream[cut - 1].env.body
    assert isinstance(plan, PlanDecided) and plan.launches
    fresh = build_scheduler("fifo", cluster(2, 4))
    effects = fresh.rebuild(run.stream[:cut], 40.0)  # the crash fell here
    repaired = [e.body for e in effects if isinstance(e, Publish)]
    assert {t.job_id for t in repaired if isinstance(t, JobTransition)} == {
        x.job_id for x in plan.launches}
    assert all(isinstance(t, JobTransition) and t.cause == "recovered" for t in repaired)
    for launch in plan.launches:
        assert fresh.jobs[launch.job_id].state is JobState.RUNNING
        assert fresh.jobs[launch.job_id].placement == launch.placement


def test_resubmitted_and_refinished_inputs_change_nothing() -> None:
    run = history("fifo")
    fresh = build_scheduler("fifo", cluster(2, 4))
    fresh.rebuild(run.stream, 40.0)
    before = table(fresh)
    spec = run.core.jobs["j0"].spec
    assert fresh.handle(envelope(SubmitJob.from_spec(spec), event_id="s-j0", occurred_at=41.0,
                                 producer="user", causation_id=None), 41.0) == []
    done = next(j for j, r in fresh.jobs.items() if r.state is JobState.FINISHED)
    assert fresh.handle(envelope(JobFinished(job_id=done, node_id="n0", iterations_done=10),
                                 event_id="f-again", occurred_at=41.0, producer="n",
                                 causation_id=None), 41.0) == []
    assert table(fresh) == before
    assert subjects.JOB_TRANSITION in RECORDED
