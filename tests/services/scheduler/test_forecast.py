"""Start-time forecasts (services/scheduler/forecast.py, forecasting.py): the scheduler's own
cycles played forward from its state, without touching it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
from domain import causes
from domain.overhead import parse_overhead
from policies.fifo import Fifo
from schemas.events import JobFinished, StartForecast
from schemas.job import JobSpec, JobState, SubmitJob
from schemas.tenants import parse_tenants
from services.runtime.effects import Effect, Publish
from services.scheduler import forecasting
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.forecast import ForecastLimits, forecast, progressed
from services.scheduler.jobs import JobRecord
from services.scheduler.lifecycle import Transition
from tests.builders import cluster, deliver, make_job, simulate


def _core(policy: str = "fifo", nodes: int = 1, gpus: int = 4, **config: Any
          ) -> SchedulerCore:
    config.setdefault("forecast_every_s", 0.0)
    return SchedulerCore(cluster(nodes, gpus), policies.make(policy), SchedulerConfig(**config))


def _after_first_cycle(core: SchedulerCore, jobs: list[JobSpec]) -> list[Effect]:
    """Every job submitted at 0, then the cycle at 0 (or the first round)."""
    for spec in jobs:
        deliver(core, SubmitJob.from_spec(spec), 0.0)
    return core.on_timer("tick" if core.config.replan == "round" else "cycle", 0.0)


def _job(job_id: str, gpus: int, seconds: float) -> JobSpec:
    return make_job(job_id).gpus(gpus).runs_for(seconds).build()


def _forecasts(effects: list[Effect]) -> list[StartForecast]:
    return [e.body for e in effects if isinstance(e, Publish) and isinstance(e.body, StartForecast)]


# Cases whose starts are worked out by hand: (policy, config, jobs as (id, GPUs, seconds),
# expected start of each waiting job). One node of 4 GPUs; every job submitted at 0.
HAND: list[tuple[str, str, dict[str, Any], list[tuple[str, int, float]], dict[str, float]]] = [
    # FIFO: a holds the node until 100; b (4 GPUs) next, 100-150; c and d share it at 150.
    ("fifo in order", "fifo", {}, [("a", 4, 100), ("b", 4, 50), ("c", 2, 30), ("d", 2, 40)],
     {"b": 100.0, "c": 150.0, "d": 150.0}),
    # FIFO without head-of-line blocking: c (1 GPU) fills beside a at once, so is not waiting;
    # b (4) waits for a and c.
    ("fifo fills around", "fifo", {}, [("a", 3, 100), ("b", 4, 10), ("c", 1, 20)],
     {"b": 100.0}),
    # SRTF: d (10 s) first; then b and c (2 GPUs each) at 10; a (100 s, 4 GPUs) once c ends
    # at 70.
    ("srtf", "srtf", {}, [("a", 4, 100), ("b", 2, 30), ("c", 2, 60), ("d", 4, 10)],
     {"a": 70.0, "b": 10.0, "c": 10.0}),
    # Rounds of 60 s: a ends at 100, its GPUs wait for the round at 120.
    ("fifo in rounds", "fifo", {"replan": "round", "round_s": 60.0},
     [("a", 4, 100), ("b", 4, 50)], {"b": 120.0}),
    # ... unless a finished job's GPUs go out at once.
    ("fifo in rounds, free at once", "fifo",
     {"replan": "round", "round_s": 60.0, "free_at_once": True},
     [("a", 4, 100), ("b", 4, 50)], {"b": 100.0}),
    # Slots of 60 s: a cycle at the earliest a slot after the last one (0): b starts at 100.
    # c is then next at 160, the slot after 100, though b ends at 130.
    ("fifo in slots", "fifo", {"replan": "slot", "round_s": 60.0},
     [("a", 4, 100), ("b", 4, 30), ("c", 4, 10)], {"b": 100.0, "c": 160.0}),
    # Tiresias: a (4 GPUs) crosses 3,250 GPU-s after 812.5 s; its wake-up is at the whole
    # second after (as Tiresias rounds it), 813, where a drops to queue 1 and b, still in
    # queue 0, takes the node.
    ("tiresias demotion", "tiresias", {}, [("a", 4, 5000), ("b", 4, 100)], {"b": 813.0}),
    # A restart costs 30 s (flat:30): b launches when a ends at 130 (a's own 30 s first).
    ("restart overhead", "fifo", {"overhead": "flat:30"}, [("a", 4, 100), ("b", 4, 50)],
     {"b": 130.0}),
]


@pytest.mark.parametrize(("policy", "config", "jobs", "expected"),
                         [h[1:] for h in HAND], ids=[h[0] for h in HAND])
def test_forecast_of_a_hand_worked_case(policy: str, config: dict[str, Any],
                                        jobs: list[tuple[str, int, float]],
                                        expected: dict[str, float]) -> None:
    if "overhead" in config:
        config = {**config, "overhead": parse_overhead(config["overhead"])}
    core = _core(policy, **config)
    effects = _after_first_cycle(core, [_job(*j) for j in jobs])
    made = core.forecasts.last
    assert made is not None and made.at == 0.0
    assert dict(made.starts) == pytest.approx(expected)
    (published,) = _forecasts(effects)
    assert published.starts == pytest.approx(expected) and published.cycle == core.cycle
    for job_id, start in expected.items():  # what `loom status` and the status carry
        assert core.status(job_id).forecast_start_s == pytest.approx(start)


def _fingerprint(core: SchedulerCore) -> tuple[Any, ...]:
    """What the scheduler's next decisions depend on."""
    recs = {jid: (r.state, r.iterations_done, r.attained_s, r.accounted_at, r.placement,
                  r.preemptions, None if r.run is None else (r.run.remaining, r.run.at))
            for jid, r in core.jobs.items()}
    return (recs, dict(core.views), core.cycle_at, core.tick_at, core.wakeup_at,
            core.last_cycle_at, core.jobs.pending_moves(),
            {jid: core.policy.waiting_status(jid) for jid in core.views},
            None if core.fit is None else (core.fit.free_gpus, dict(core.fit.placed)))


@pytest.mark.parametrize("policy", ["fifo", "srtf", "tiresias", "muri-s"])
def test_forecasting_leaves_the_scheduler_as_it_was(policy: str) -> None:
    """Two schedulers fed the same inputs, one forecasting after every cycle and on every
    status request, decide the same, message for message, and hold the same state."""
    jobs = [_job(f"j{i}", 1 + i % 4, 50 + 37 * i) for i in range(10)]
    if policy == "muri-s":
        jobs = [j.model_copy(update={"stage_times_s": (0.1, 0.5, 0.2)}) for j in jobs]
    plain, forecasting_core = _core(policy, forecast_every_s=None), _core(policy)
    outs = []
    for core in (plain, forecasting_core):
        effects = _after_first_cycle(core, jobs)
        before = _fingerprint(core)
        core.state(0.0)  # a status request
        forecasting.make(core, 0.0)
        assert _fingerprint(core) == before
        running = sorted(core.jobs.running)
        for jid in running[:2]:  # two runs end, and the cycle after
            rec = core.jobs.running[jid]
            effects += deliver(core, JobFinished(job_id=jid, node_id=rec.placement[0][0],
                                                 iterations_done=rec.spec.iterations), 500.0)
        effects += core.on_timer("cycle", 500.0)
        outs.append([e for e in effects
                     if not (isinstance(e, Publish) and isinstance(e.body, StartForecast))])
    assert outs[0] == outs[1]


@pytest.mark.parametrize(("limits", "expected"), [
    (ForecastLimits(), {"b": 100.0, "c": 150.0, "d": 230.0}),
    (ForecastLimits(horizon_s=200.0), {"b": 100.0, "c": 150.0, "d": None}),
    (ForecastLimits(max_cycles=1), {"b": 100.0, "c": None, "d": None}),
])
def test_jobs_past_the_limits_get_no_forecast(limits: ForecastLimits,
                                              expected: dict[str, float | None]) -> None:
    core = _core("fifo")
    _after_first_cycle(core, [_job("a", 4, 100), _job("b", 4, 50), _job("c", 4, 80),
                              _job("d", 4, 10)])
    made = forecast(forecasting.capture(core, 0.0), limits)
    assert dict(made.starts) == expected
    assert made.complete is (None not in expected.values())


def test_a_status_request_refreshes_a_stale_forecast_and_no_more() -> None:
    core = _core("fifo", forecast_every_s=60.0)
    _after_first_cycle(core, [_job("a", 4, 100), _job("b", 4, 50)])
    first = core.forecasts.last
    assert first is not None and first.at == 0.0
    state = core.state(30.0)  # within a minute: the same forecast
    assert core.forecasts.last is first and state["forecast"] == {"at": 0.0, "every_s": 60.0}
    (row,) = [r for r in state["jobs"] if r["job_id"] == "b"]
    assert row["forecast_start_s"] == 100.0
    state = core.state(75.0)  # stale: made afresh from the state at 75 s
    assert core.forecasts.last is not first and state["forecast"]["at"] == 75.0
    assert core.status("b").forecast_start_s == 100.0
    assert core.status("a").forecast_start_s is None  # running: no start to forecast


def test_a_status_request_refreshes_a_forecast_that_leaves_out_a_waiting_job() -> None:
    """A job that began waiting after the latest forecast (here an arrival; on a live
    cluster also a reclaimed or preempted job) would show no start ("?") until the forecast
    was `forecast_every_s` old: the request makes a fresh one, once."""
    core = _core("fifo", forecast_every_s=60.0)
    _after_first_cycle(core, [_job("a", 4, 100), _job("b", 4, 50)])
    first = core.forecasts.last
    deliver(core, SubmitJob.from_spec(_job("c", 4, 10)), 30.0)
    assert not _forecasts(core.on_timer("cycle", 30.0))  # 30 s after the last: not published
    assert core.forecasts.last is first
    state = core.state(31.0)
    fresh = core.forecasts.last
    assert fresh is not first and state["forecast"]["at"] == 31.0
    assert {r["job_id"]: r["forecast_start_s"] for r in state["jobs"]} == {
        "a": None, "b": 100.0, "c": 150.0}
    core.state(40.0)  # every waiting job is in it: kept
    assert core.forecasts.last is fresh


def test_forecasts_are_off_by_default() -> None:
    core = _core("fifo", forecast_every_s=None)
    effects = _after_first_cycle(core, [_job("a", 4, 100), _job("b", 4, 50)])
    assert not _forecasts(effects) and core.forecasts.last is None
    state = core.state(10.0)
    assert state["forecast"] is None and core.forecasts.last is None
    assert all(r["forecast_start_s"] is None for r in state["jobs"])


def test_published_forecasts_keep_their_cadence_and_split_in_parts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forecasting, "PART", 2)
    core = _core("fifo", forecast_every_s=100.0)
    jobs = [_job("a", 4, 60)] + [_job(f"w{i}", 4, 60) for i in range(5)]
    parts = _forecasts(_after_first_cycle(core, jobs))
    assert [(p.part, p.parts, len(p.starts)) for p in parts] == [(0, 3, 2), (1, 3, 2), (2, 3, 1)]
    merged = {k: v for p in parts for k, v in p.starts.items()}
    assert merged == {f"w{i}": 60.0 * (i + 1) for i in range(5)}
    finished = deliver(core, JobFinished(job_id="a", node_id="n0", iterations_done=60), 60.0)
    assert not _forecasts(finished + core.on_timer("cycle", 60.0))  # 60 s after the last
    deliver(core, JobFinished(job_id="w0", node_id="n0", iterations_done=60), 120.0)
    again = _forecasts(core.on_timer("cycle", 120.0))
    assert again and again[0].at == 120.0


class _Unforkable(Fifo):
    """A policy holding something `copy.deepcopy` refuses (a lock, a solver handle)."""

    name = "unforkable"

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_a_policy_that_cannot_be_copied_gets_no_forecasts_and_decides_as_before() -> None:
    core = SchedulerCore(cluster(1, 4), _Unforkable(), SchedulerConfig(forecast_every_s=0.0))
    effects = _after_first_cycle(core, [_job("a", 4, 100), _job("b", 4, 50)])
    assert not _forecasts(effects) and core.forecasts.refused is core.policy
    assert core.status("b").forecast_start_s is None
    assert core.state(5.0)["forecast"] == {"at": None, "every_s": 0.0}


# -- exact with no later arrivals --------------------------------------------------------------

workloads = st.lists(st.tuples(st.sampled_from([1, 1, 2, 4, 8]),  # GPUs
                               st.integers(1, 500)),  # seconds of work
                     min_size=2, max_size=25)


@settings(max_examples=25, deadline=None)
@given(rows=workloads, policy=st.sampled_from(["fifo", "srtf", "srsf", "tiresias"]),
       overhead=st.sampled_from(["none", "muri", "flat:30"]),
       speed=st.sampled_from([1.0, 0.37]))
def test_with_every_job_known_the_forecast_is_the_start(
        rows: list[tuple[int, int]], policy: str, overhead: str, speed: float) -> None:
    """Every job submitted at 0, so nothing arrives after any forecast, and the scheduler's
    speed estimates are the simulated nodes' own: every forecast made while a job waited is
    its start, to float rounding (forecasts after every cycle)."""
    jobs = [make_job(f"j{i:02d}").gpus(g).iterations(s).iteration_time(speed).build()
            for i, (g, s) in enumerate(rows)]
    out = simulate(jobs, policy, cluster(2, 8), overhead=overhead, forecast_every_s=0.0)
    errors = out.summary["forecast_error_s"]
    waited = [j for j in out.jobs if j.queueing_s and j.queueing_s > 0]
    if errors is None:  # no job ever waited: nothing to forecast
        assert not waited
        return
    assert isinstance(errors, dict)
    assert errors["unforecast"] == 0
    assert errors["jobs"] >= len(waited)
    if errors["forecasts"]:
        assert errors["p90"] is not None and errors["p90"] < 1e-6
        assert errors["mean"] is not None and errors["mean"] < 1e-6


QUEUES = parse_tenants({
    "cohorts": {"lab": {"half_life_s": 600}},
    "queues": {"a": {"cohort": "lab", "tenants": ["a"], "nominal": 8, "min_runtime_s": 50},
               "b": {"cohort": "lab", "tenants": ["b"], "nominal": 6, "borrowing_limit": 4},
               "c": {"cohort": "lab", "tenants": ["c"], "nominal": 2, "lending_limit": 1}},
}, "queues.toml")


@settings(max_examples=25, deadline=None)
@given(rows=workloads, policy=st.sampled_from(["fifo", "srtf", "tiresias"]),
       round_s=st.sampled_from([None, 60.0]))
def test_under_queues_with_every_job_known_the_forecast_is_the_start(
        rows: list[tuple[int, int]], policy: str, round_s: float | None) -> None:
    """The forecast plays the queue layer forward too (borrowing, claims, fair share on decayed
    usage, reclaim): with no later arrivals each forecast is the start."""
    jobs = [make_job(f"j{i:02d}").tenant("abc"[i % 3]).gpus(g).runs_for(s).build()
            for i, (g, s) in enumerate(rows)]
    out = simulate(jobs, policy, cluster(2, 8), tenants=QUEUES, forecast_every_s=0.0,
                   round_s=round_s)
    errors = out.summary["forecast_error_s"]
    if errors is None:
        assert not [j for j in out.jobs if j.queueing_s]
        return
    assert isinstance(errors, dict) and errors["unforecast"] == 0
    if errors["forecasts"]:
        assert errors["p90"] is not None and errors["p90"] < 1e-6


def test_forecasting_changes_no_decision_of_a_simulation() -> None:
    """Forecasts on (after every cycle) or off: the same digest, over arrivals spread in time."""
    jobs = [make_job(f"j{i}").gpus(1 + i % 4).runs_for(100 + 53 * i).submit(17.0 * i).build()
            for i in range(30)]
    for policy in ("srtf", "tiresias", "fifo"):
        off = simulate(jobs, policy, cluster(1, 8)).summary
        on = simulate(jobs, policy, cluster(1, 8), forecast_every_s=0.0).summary
        assert on["decision_digest"] == off["decision_digest"]
        assert off["forecast_error_s"] is None
        errors = on["forecast_error_s"]
        assert isinstance(errors, dict) and errors["jobs"] > 0 and errors["forecasts"] > 0
        # Later arrivals cut in (srtf, tiresias) or not (fifo: a later arrival ranks last).
        assert errors["median"] is not None and errors["median"] >= 0
        assert errors["p90"] is not None and errors["p90"] >= errors["median"]


@pytest.mark.parametrize("policy", sorted(policies.REGISTRY))
def test_every_policy_forecasts_and_decides_as_without(policy: str) -> None:
    """Every registered policy forks (those holding compiled LPs with an empty problem cache)
    and forecasts after every cycle without a decision changing."""
    jobs = [make_job(f"j{i}").gpus(1 + i % 4).runs_for(100 + 50 * i).submit(10.0 * i).build()
            for i in range(12)]
    off = simulate(jobs, policy, cluster(1, 4)).summary
    on = simulate(jobs, policy, cluster(1, 4), forecast_every_s=0.0).summary
    assert on["decision_digest"] == off["decision_digest"]
    errors = on["forecast_error_s"]
    if errors is not None:  # None: no job of this workload waited under the policy
        assert isinstance(errors, dict) and errors["forecasts"] > 0, errors


@settings(max_examples=50, deadline=None)
@given(iterations=st.integers(1, 10_000), done=st.floats(0, 12_000),
       attained=st.floats(0, 1e6), time_s=st.floats(0.01, 10), gpus=st.sampled_from([1, 4]))
def test_a_progressed_view_is_the_records_view(iterations: int, done: float, attained: float,
                                               time_s: float, gpus: int) -> None:
    """The forecast's shortcut for a running job's view a cycle later is what the record
    itself would give (`JobRecord.view`), field for field."""
    spec = make_job("a").gpus(gpus).iterations(iterations).iteration_time(time_s).build()
    rec = JobRecord(spec=spec, state=JobState.RUNNING, placement=(("n0", tuple(range(gpus))),),
                    preemptions=2, last=Transition(5.0, JobState.QUEUED, JobState.RUNNING,
                                                   causes.STARTED))
    before = rec.view()
    rec.iterations_done, rec.attained_s = done, attained
    assert progressed(before, done, attained) == rec.view()
