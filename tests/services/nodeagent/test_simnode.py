from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.overhead import parse_overhead
from domain.progress import CATCH_UP_CYCLES
from schemas import subjects
from schemas.cluster import NodeSpec
from schemas.events import (
    CycleStarted,
    JobFinished,
    Launch,
    NodeCommand,
    NodeStatus,
    Stop,
    envelope,
)
from schemas.job import JobSpec
from services.nodeagent.simfleet import SimNodeCore
from services.runtime.effects import (
    CancelTimer,
    Effect,
    Publish,
    ReserveOrder,
    SetTimer,
    SetTimers,
)
from tests.builders import make_job

NODE = NodeSpec(node_id="n0", switch_id="s0", gpus=4)


def _cmd(core: SimNodeCore, now: float, launches=(), stops=(), cycle: int = 1):  # type: ignore[no-untyped-def]
    body = NodeCommand(node_id="n0", cycle=cycle, launches=tuple(launches), stops=tuple(stops))
    return core.handle(envelope(body, event_id=f"c{now}", occurred_at=now, producer="t",
                                causation_id=None), now)


def _cycle(core: SimNodeCore, now: float):  # type: ignore[no-untyped-def]
    env = envelope(CycleStarted(cycle=2, trigger="t"), event_id=f"y{now}", occurred_at=now,
                   producer="t", causation_id=None)
    return core.handle(env, now)


def _launch(spec, placement=(("n0", (0, 1)),), done: float = 0.0) -> Launch:  # type: ignore[no-untyped-def]
    return Launch(job_id=spec.job_id, spec=spec, placement=placement, iterations_done=done)


@pytest.mark.parametrize(
    ("overhead", "expected_finish"),
    [
        ("none", 100.0),  # 100 iterations × 1 s
        ("flat:30", 130.0),  # restart delay first
        ("muri", 101.5),  # Muri's 1.5 % slowdown, no charge without an interrupting event
    ],
)
def test_launch_arms_the_finish_timer(overhead: str, expected_finish: float) -> None:
    core = SimNodeCore(NODE, parse_overhead(overhead))
    (timer,) = _cmd(core, 0.0, [_launch(make_job("a").gpus(2).runs_for(100).build())])
    assert isinstance(timer, SetTimer) and timer.key == ("finish", "n0", "a")
    assert timer.at == pytest.approx(expected_finish)


def test_muri_charges_every_interrupting_cycle_per_model() -> None:
    """A cycle is logged, with a place reserved for its re-arm; the run is charged when its
    timer comes up at the finish the launch set, and set again where the cycle would have
    set it."""
    core = SimNodeCore(NODE, parse_overhead("muri"))
    spec = make_job("a").model("a2c").gpus(2).runs_for(1000).build()  # a2c on 2 GPUs: 39 s
    (armed,) = _cmd(core, 0.0, [_launch(spec)])
    assert isinstance(armed, SetTimer) and armed.at == pytest.approx(1015.0)
    assert _cycle(core, 100.0) == [ReserveOrder(1)]
    (again,) = core.on_timer(("finish", "n0", "a"), armed.at)
    # 100 s elapsed, 39 s lost: 61 s of progress at 1.015 s per iteration.
    remaining = 1000 - 61 / 1.015
    assert isinstance(again, SetTimer) and again.key == ("finish", "n0", "a") and again.order == 0
    assert again.at == pytest.approx(100.0 + remaining * 1.015)
    (done,) = core.on_timer(("finish", "n0", "a"), again.at)  # no cycle since: it finishes
    assert isinstance(done, Publish) and isinstance(done.body, JobFinished)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a2c", "resnet18", "bert"]), st.integers(1, 4),
                          st.integers(1, 5000), st.floats(0.0, 0.9)), min_size=1, max_size=4),
       st.lists(st.floats(0.5, 500.0), min_size=1, max_size=9),
       st.sampled_from([2, 3, CATCH_UP_CYCLES]))
def test_runs_charged_lazily_come_to_what_a_run_by_run_accounting_gives(
        jobs: list[tuple[str, int, int, float]], gaps: list[float], catch_up: int) -> None:
    """Bit for bit what advancing each run at every cycle then asking its finish (`advance`
    + `finish_timer`, the eager node) gives: at a catch-up (one `SetTimers`, in the node's
    order of runs), when a timer comes up early (set again in its place of that order), and
    at a stop."""
    core = SimNodeCore(NodeSpec(node_id="n0", switch_id="s0", gpus=16), parse_overhead("muri"))
    for i, (model, gpus, seconds, done) in enumerate(jobs):
        spec = make_job(f"j{i}").model(model).gpus(gpus).runs_for(seconds).build()
        if i % 2:  # some with a recorded failure mark ahead
            spec = spec.model_copy(update={"fail_at": (seconds * (done + 1.0) / 2.0,)})
        _cmd(core, 0.0, [_launch(spec, placement=(("n0", tuple(range(gpus))),),
                                 done=seconds * done)], cycle=i + 1)
    eager = {jid: copy.deepcopy(run) for jid, run in core.jobs.items()}
    expected: dict[str, float] = {}
    now = 0.0
    with pytest.MonkeyPatch.context() as m:
        m.setattr("services.nodeagent.simfleet.CATCH_UP_CYCLES", catch_up)
        for n, gap in enumerate(gaps, start=1):
            now += gap
            for jid, twin in eager.items():
                twin.advance(now, interrupted=True)
                expected[jid] = twin.finish_timer(now).at
            (effect,) = _cycle(core, now)
            if n % catch_up:
                assert effect == ReserveOrder(len(eager))
            else:
                assert isinstance(effect, SetTimers)
                assert list(effect.timers) == [(("finish", "n0", j), expected[j]) for j in eager]
    first = next(iter(eager))
    stopped = _cmd(core, now, stops=[Stop(job_id=first, reason="preempted")])
    (status,) = [e.body for e in stopped if isinstance(e, Publish)]
    eager[first].advance(now, interrupted=False)
    assert isinstance(status, NodeStatus) and status.progress == {first: eager[first].done()}
    for order, jid in list(enumerate(eager))[1:]:  # places as the last cycle ordered them
        fired = core.on_timer(("finish", "n0", jid), now)
        if len(gaps) % catch_up:
            assert fired == [SetTimer(("finish", "n0", jid), expected[jid], order=order)]
        else:  # caught up at the last cycle: the timer stands, and its run ends
            assert isinstance(fired[0], Publish)


def test_only_the_leader_of_a_gang_accounts_and_reports() -> None:
    core = SimNodeCore(NODE, parse_overhead("none"))
    spec = make_job("g").gpus(8).runs_for(50).build()
    eff = _cmd(core, 0.0, [_launch(spec, placement=(("n1", (0, 1, 2, 3)), ("n0", (0, 1, 2, 3))))])
    assert eff == [] and "g" in core.jobs and not core.jobs["g"].leader
    assert _cycle(core, 10.0) == []


def test_stop_reports_progress_and_cancels_the_timer() -> None:
    core = SimNodeCore(NODE, parse_overhead("none"))
    _cmd(core, 0.0, [_launch(make_job("a").runs_for(100).build(), done=20.0)])
    eff = _cmd(core, 30.0, stops=[Stop(job_id="a", reason="preempted")])
    assert CancelTimer(("finish", "n0", "a")) in eff
    (status,) = [e.body for e in eff if isinstance(e, Publish)]
    assert isinstance(status, NodeStatus) and status.progress == {"a": 50.0}
    assert core.jobs == {}


def test_finish_timer_reports_the_job_done() -> None:
    core = SimNodeCore(NODE, parse_overhead("none"))
    _cmd(core, 0.0, [_launch(make_job("a").runs_for(10).build())])
    (pub,) = core.on_timer(("finish", "n0", "a"), 10.0)
    assert isinstance(pub, Publish) and pub.body == JobFinished(job_id="a", node_id="n0",
                                                                iterations_done=10.0)


@pytest.mark.parametrize(
    ("text", "per_event", "restart", "slowdown"),
    [
        ("none", 0.0, 0.0, 1.0),
        ("flat:30", 0.0, 30.0, 1.0),
        ("muri", 10.0, 0.0, 1.015),  # unknown model: Muri's 10 s default
        ("elasticflow", 2.0, (2 + 1) * 2.0 + 27.0, 1.0),  # log2(4) + 1 = 3 → 6 s + 27 s
        ("elasticflow-baseline", 0.0, (2 + 1) * 2.0 + 2.0, 1.0),  # a start only: 6 s + 2 s
    ],
)
def test_overhead_models(text: str, per_event: float, restart: float, slowdown: float) -> None:
    m = parse_overhead(text)
    spec = make_job("a").model("unknown-model").gpus(4).build()
    assert m.per_event(spec) == per_event
    assert m.restart(spec) == pytest.approx(restart)
    assert m.iteration_time(spec) == pytest.approx(spec.iteration_time_s * slowdown)


@pytest.mark.parametrize("text", ["zero", "flat:", "flat:-1", "flat:inf", "flat:abc"])
def test_bad_overhead_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="overhead"):
        parse_overhead(text)


def _wants_cycle(core: SimNodeCore) -> bool:
    (sub,) = [s for s in core.subscriptions() if s.subject == subjects.CYCLE_STARTED]
    assert sub.wants is not None
    return sub.wants(envelope(CycleStarted(cycle=1, trigger="t"), event_id="y", occurred_at=0.0,
                              producer="t", causation_id=None))


@given(st.lists(st.tuples(st.sampled_from(["launch", "follow", "stop", "finish"]),
                          st.sampled_from("abc")), max_size=25))
def test_a_node_wants_a_cycle_exactly_when_the_cycle_would_cost_a_run_of_it_time(
        steps: list[tuple[str, str]]) -> None:
    core = SimNodeCore(NODE, parse_overhead("muri"))
    now = 0.0
    for action, job in steps:
        now += 1.0
        if action in ("launch", "follow"):  # as the gang's leader, or one of its followers
            where = (("n0", (0,)),) if action == "launch" else (("n1", (0,)), ("n0", (0,)))
            _cmd(core, now, [_launch(make_job(job).model("a2c").gpus(len(where))
                                     .runs_for(100).build(), placement=where)])
        elif action == "stop" and job in core.jobs:
            _cmd(core, now, stops=[Stop(job_id=job, reason="preempted")])
        elif action == "finish" and job in core.jobs and core.jobs[job].leader:
            core.on_timer(("finish", "n0", job), now)
        charged = any(r.leader and r.progress.per_event_s for r in core.jobs.values())
        assert _wants_cycle(core) == charged
        if not charged:
            assert _cycle(core, now) == []  # a cycle passed over would have changed nothing


# -- recorded failures (`JobSpec.fail_at`) ---------------------------------------------------

def _failing(marks: tuple[float, ...], seconds: int = 100) -> JobSpec:
    return make_job("a").runs_for(seconds).build().model_copy(update={"fail_at": marks})


def _timer(effects: list[Effect]) -> SetTimer:
    (timer,) = effects
    assert isinstance(timer, SetTimer)
    return timer


def _ended(effects: list[Effect]) -> JobFinished:
    (pub,) = effects
    assert isinstance(pub, Publish) and isinstance(pub.body, JobFinished)
    return pub.body


def _progress(effects: list[Effect]) -> dict[str, float]:
    (status,) = [e.body for e in effects if isinstance(e, Publish)]
    assert isinstance(status, NodeStatus)
    return status.progress


@pytest.mark.parametrize(("marks", "done", "timer_at", "reported", "permanent"), [
    ((30.0, 70.0), 0.0, 30.0, 30.0, False),  # the first mark, then retried
    ((30.0, 70.0), 30.0, 40.0, 70.0, False),  # resumed from the first: the next one
    ((30.0, 70.0), 70.0, 30.0, None, False),  # past both marks: it completes
    ((30.0, 100.0), 30.0, 70.0, 100.0, True),  # the last run fails at its end, for good
    ((100.0,), 0.0, 100.0, 100.0, True),
    ((30.0, 70.0), 29.5, 0.5, 30.0, False),  # preempted just short of a mark
])
def test_a_run_fails_at_its_next_recorded_mark(
        marks: tuple[float, ...], done: float, timer_at: float, reported: float | None,
        permanent: bool) -> None:
    core = SimNodeCore(NODE, parse_overhead("none"))
    timer = _timer(_cmd(core, 0.0, [_launch(_failing(marks), done=done)]))
    assert timer.at == pytest.approx(timer_at)
    ended = _ended(core.on_timer(("finish", "n0", "a"), timer.at))
    if reported is None:
        assert ended == JobFinished(job_id="a", node_id="n0", iterations_done=100.0)
        return
    assert ended.iterations_done == reported  # exactly the mark: the job resumes there
    assert ended.permanent is permanent
    assert ended.failure == (f"recorded failure: the trace's job failed here, at iteration "
                             f"{reported:g} of 100")


def test_a_recorded_failure_lets_the_job_run_here_again_a_completion_does_not() -> None:
    core = SimNodeCore(NODE, parse_overhead("none"))
    _cmd(core, 0.0, [_launch(_failing((30.0,)))])
    core.on_timer(("finish", "n0", "a"), 30.0)
    timer = _timer(_cmd(core, 40.0, [_launch(_failing((30.0,)), done=30.0)], cycle=2))
    core.on_timer(("finish", "n0", "a"), timer.at)  # completed
    assert _cmd(core, 200.0, [_launch(_failing((30.0,)), done=0.0)], cycle=3) == []


def test_the_mark_timer_follows_the_overheads() -> None:
    core = SimNodeCore(NODE, parse_overhead("flat:30"))
    timer = _timer(_cmd(core, 0.0, [_launch(_failing((40.0,)))]))
    assert timer.at == pytest.approx(30.0 + 40.0)  # the restart first, then 40 iterations


def test_a_run_stopped_at_its_mark_reports_just_short_of_it() -> None:
    """A stop handled at the mark's instant (before its timer): the failure has not happened
    yet, so the next run still replays it."""
    core = SimNodeCore(NODE, parse_overhead("none"))
    _cmd(core, 0.0, [_launch(_failing((30.0, 70.0)))])
    done = _progress(_cmd(core, 30.0, stops=[Stop(job_id="a", reason="preempted")],
                          cycle=2))["a"]
    assert done < 30.0 and done == pytest.approx(30.0)
    timer = _timer(_cmd(core, 40.0, [_launch(_failing((30.0, 70.0)), done=done)], cycle=3))
    assert timer.at == pytest.approx(40.0)
    ended = _ended(core.on_timer(("finish", "n0", "a"), timer.at))
    assert ended.iterations_done == 30.0 and ended.failure is not None


@settings(max_examples=150, deadline=None)
@given(data=st.data(), seconds=st.integers(1, 10_000), failed=st.booleans(),
       overhead=st.sampled_from(["none", "flat:30", "muri"]))
def test_a_job_with_marks_runs_exactly_its_recorded_time_before_its_outcome(
        data: st.DataObject, seconds: int, failed: bool, overhead: str) -> None:
    """Whatever the preemptions, a job is relaunched from what each run reported until it
    completes or fails for good: its runs' useful time adds up to its recorded run time, it
    fails once at each mark, and it ends failed exactly when its last mark is its end."""
    inner = data.draw(st.lists(st.integers(1, max(1, seconds - 1)), unique=True, max_size=6)
                      .map(sorted))
    marks = tuple(float(m) for m in inner if m < seconds) + ((float(seconds),) if failed else ())
    spec = make_job("a").model("a2c").runs_for(seconds).build()
    if marks:
        spec = spec.model_copy(update={"fail_at": marks})
    model = parse_overhead(overhead)
    core = SimNodeCore(NODE, model)
    now, done, useful, cycle = 0.0, 0.0, 0.0, 0
    reports: list[float] = []
    for run in range(len(marks) + 6):
        cycle += 1
        timer = _timer(_cmd(core, now, [_launch(spec, done=done)], cycle=cycle))
        ready = now + model.restart(spec, 2)
        # Up to five preemptions anywhere in a run, then the runs go on undisturbed.
        stop_at = data.draw(st.one_of(st.none(), st.floats(now, timer.at))) if run < 5 else None
        if stop_at is not None and stop_at < timer.at:
            cycle += 1
            stopped = _cmd(core, stop_at, stops=[Stop(job_id="a", reason="preempted")],
                           cycle=cycle)
            useful += max(0.0, stop_at - ready)
            done, now = _progress(stopped)["a"], stop_at
            continue
        ended = _ended(core.on_timer(("finish", "n0", "a"), timer.at))
        useful += timer.at - ready
        now, done = timer.at, ended.iterations_done
        if ended.failure is None:
            break
        reports.append(ended.iterations_done)
        if ended.permanent:
            break
    slow = model.iteration_time(spec, NODE.gpu_type, 2) / spec.iteration_time_s
    assert useful == pytest.approx(seconds * slow, rel=1e-6, abs=1e-6)
    assert tuple(reports) == marks
    assert (bool(reports) and reports[-1] == seconds) is failed
