from __future__ import annotations

import pytest

from schemas.events import JobTransitionV1, Launch, PlanDecided, Stop, envelope
from schemas.job import JobState
from services.metrics.core import MetricsCore, plan_record, transition_record
from services.metrics.outcomes import percentile
from tests.builders import make_job

Q, R, P, F, J = (JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED, JobState.FINISHED,
                 JobState.REJECTED)


def _feed(m: MetricsCore, t: float, body) -> None:  # type: ignore[no-untyped-def]
    m.handle(envelope(body, event_id=f"e{t}{id(body)}", occurred_at=t, producer="scheduler",
                      causation_id=None), t)


def _tr(job, state, prev, spec=None):  # type: ignore[no-untyped-def]
    return JobTransitionV1(job_id=job, state=state, previous=prev, cause="x", spec=spec)


def _run_script(m: MetricsCore) -> None:
    a = make_job("a").gpus(2).submit(0).build()
    b = make_job("b").gpus(2).submit(10).deadline(100).build()
    c = make_job("c").gpus(2).submit(10).deadline(50).build()
    _feed(m, 0, _tr("a", Q, None, a))
    _feed(m, 0, _tr("a", R, Q))
    _feed(m, 10, _tr("b", Q, None, b))
    _feed(m, 10, _tr("c", Q, None, c))
    _feed(m, 10, _tr("b", R, Q))
    _feed(m, 40, _tr("a", P, R))
    _feed(m, 40, _tr("c", R, Q))
    _feed(m, 60, _tr("c", F, R))
    _feed(m, 60, _tr("a", R, P))
    _feed(m, 90, _tr("b", F, R))
    _feed(m, 100, _tr("a", F, R))


def test_job_outcomes_and_summary() -> None:
    m = MetricsCore(total_gpus=4)
    _run_script(m)
    s = m.summary()
    # JCTs: a 100, b 80, c 50.
    assert s["finished"] == 3 and s["avg_jct_s"] == pytest.approx(230 / 3)
    assert s["p50_jct_s"] == 80 and s["p99_jct_s"] == 100 and s["makespan_s"] == 100
    assert s["avg_queueing_s"] == pytest.approx((0 + 0 + 30) / 3)
    assert s["preemptions"] == 1
    # b met its deadline (90 ≤ 100); c finished at 60 > 50.
    assert s["deadline_ratio"] == 0.5
    # busy GPU-seconds: a 0–40 and 60–100 (80 s), b 10–90 (80 s), c 40–60 (20 s), ×2 GPUs.
    assert s["gpu_util"] == pytest.approx(2 * 180 / (4 * 100))
    assert m.jobs["a"].start_s == 0 and m.jobs["c"].queueing_s == 30


def test_digest_depends_on_every_decision_and_its_order() -> None:
    m1, m2, m3 = MetricsCore(4), MetricsCore(4), MetricsCore(4)
    _run_script(m1)
    _run_script(m2)
    assert m1.digest == m2.digest
    _run_script(m3)
    _feed(m3, 100, PlanDecided(cycle=9))
    assert m3.digest != m1.digest


@pytest.mark.parametrize(("fields", "at", "record"), [
    pytest.param(dict(job_id="a", state=Q, previous=None, cause="admitted"), 0.0,
                 "T 0.0 a None queued admitted 0 () 0.0\n", id="admitted"),
    pytest.param(dict(job_id="j-7", state=R, previous=P, cause="started", gpus=3,
                      placement=(("n1", (0, 1)), ("n2", (5,))), iterations_done=12.5),
                 1234.5678, "T 1234.5678 j-7 preempted running started 3 "
                 "(('n1', (0, 1)), ('n2', (5,))) 12.5\n", id="running-on-two-nodes"),
    pytest.param(dict(job_id="b", state=F, previous=R, cause="completed",
                      iterations_done=1e-07), 1e20,
                 "T 1e+20 b running finished completed 0 () 1e-07\n", id="floats-as-repr"),
])
def test_a_transition_record_reads_as_the_digest_has_always_read_it(
        fields: dict[str, object], at: float, record: str) -> None:
    """The line each transition adds to the decision digest: states as their text, floats
    as their shortest repr. Every recorded digest depends on these bytes."""
    assert transition_record(JobTransitionV1.model_validate(fields), at) == record


@pytest.mark.parametrize(("launched", "stopped", "record"), [
    pytest.param((), (), "P 7.5 3 [] [] 2 16\n", id="nothing-changes"),
    pytest.param((("a", (("n1", (0, 1)),), 0.0), ("b", (("n1", (2,)), ("n2", (0,))), 4.25)),
                 (("c", "preempted"), ("d", "migrated")),
                 "P 7.5 3 [a@(('n1', (0, 1)),):0.0 b@(('n1', (2,)), ('n2', (0,))):4.25] "
                 "[c:preempted d:migrated] 2 16\n", id="launches-and-stops-in-order"),
])
def test_a_plan_record_reads_as_the_digest_has_always_read_it(
        launched: tuple[tuple[str, tuple[tuple[str, tuple[int, ...]], ...], float], ...],
        stopped: tuple[tuple[str, str], ...], record: str) -> None:
    """The line each plan adds to the decision digest: launches with their placement and
    progress, stops with their reason, in the plan's order."""
    launches = tuple(Launch(job_id=j, spec=make_job(j).build(), placement=slots,
                            iterations_done=done) for j, slots, done in launched)
    stops = tuple(Stop(job_id=j, reason=why) for j, why in stopped)
    plan = PlanDecided(cycle=3, launches=launches, stops=stops, running=2, busy_gpus=16)
    assert plan_record(plan, 7.5) == record


def test_rejected_and_best_effort_jobs() -> None:
    m = MetricsCore(4)
    big = make_job("big").gpus(8).deadline(10).build()
    be = make_job("be").deadline(5, best_effort=True).build()
    _feed(m, 0, _tr("big", J, None, big))
    _feed(m, 0, _tr("be", Q, None, be))
    _feed(m, 0, _tr("be", R, Q))
    _feed(m, 20, _tr("be", F, R))
    s = m.summary()
    assert s["rejected"] == 1 and s["deadline_ratio"] == 0.0  # best-effort excluded
    assert (s["deadline_jobs"], s["accepted"], s["declined"], s["deadline_met"]) == (1, 0, 1, 0)
    assert s["best_effort_avg_jct_s"] == 20.0


@pytest.mark.parametrize(("n", "q", "index"), [(100, 0.99, 99), (1000, 0.99, 990), (3, 0.5, 1),
                                               (1, 0.99, 0)])
def test_percentile_follows_muri_calc(n: int, q: float, index: int) -> None:
    values = list(range(n))
    assert percentile(values, q) == index


def test_finish_time_fairness_uses_the_average_contention() -> None:
    # 4 GPUs. a (2 GPUs, 100 s of work) alone 0–50, then b arrives and both are active until
    # a ends at 150: a's average contention N̄ = (1·50 + 2·100) / 150 = 5/3; its fair share is
    # min(1, 4 / (5/3 · 2)) = 1, so ρ_a = 150 · 1 / 100 = 1.5. b (4 GPUs, 20 s) active 50–170:
    # N̄ = (2·100 + 1·20) / 120 = 11/6, share = min(1, 4 / (11/6 · 4)) = 6/11, ρ_b = 120·6/11/20.
    m = MetricsCore(total_gpus=4)
    a = make_job("a").gpus(2).runs_for(100).submit(0).build()
    b = make_job("b").gpus(4).runs_for(20).submit(50).build()
    _feed(m, 0, _tr("a", Q, None, a))
    _feed(m, 0, _tr("a", R, Q))
    _feed(m, 50, _tr("b", Q, None, b))
    _feed(m, 150, _tr("a", F, R))
    _feed(m, 150, _tr("b", R, Q))
    _feed(m, 170, _tr("b", F, R))
    assert m.jobs["a"].contention == pytest.approx(5 / 3)
    assert m.jobs["a"].ftf_rho == pytest.approx(1.5)
    assert m.jobs["b"].ftf_rho == pytest.approx(120 * 6 / 11 / 20)
    s = m.summary()
    assert s["ftf_rho_max"] == pytest.approx(max(1.5, 120 * 6 / 11 / 20))
