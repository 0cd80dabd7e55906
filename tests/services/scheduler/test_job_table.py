"""The job table packs the records of ended jobs (a million-job run keeps them all) without
losing what status queries, late reports and resubmissions read from them."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import causes
from domain.progress import RunProgress
from schemas.job import JobSpec, JobState
from schemas.status import Status, StatusCode
from services.scheduler.jobs import JobRecord, JobTable
from tests.builders import make_job
from traces import load_trace

_FIELDS = ("admitted", "state", "iterations_done", "attained_s", "accounted_at", "placement",
           "preemptions", "started_at", "ended_at", "status", "last", "hosts", "spec")


def _finished(table: JobTable, spec: JobSpec) -> JobRecord:
    rec = table.add(spec, 0.0)
    table.transition(rec, JobState.QUEUED, causes.ADMITTED, 0.0)
    rec.place((("n0", (0, 1)),))
    table.set_running(rec)
    table.transition(rec, JobState.RUNNING, causes.STARTED, 1.0)
    rec.iterations_done, rec.attained_s, rec.started_at = 100.0, 99.0, 1.0
    table.clear_running(spec.job_id)
    rec.ended_at = 100.0
    rec.status = Status(code=StatusCode.FINISHED, reason="finished on n0", decided_by="n0")
    table.transition(rec, JobState.FINISHED, causes.COMPLETED, 100.0)
    return rec


def test_an_ended_record_reads_back_as_it_was_once_packed() -> None:
    table = JobTable()
    rec = _finished(table, make_job("a").gpus(2).build())
    before = {f: getattr(rec, f) for f in _FIELDS}
    assert table["a"] is rec  # not packed until asked: its handler may still be writing it
    table.pack_ended()
    after = table["a"]
    assert after is not rec  # a copy, unpacked on demand
    assert {f: getattr(after, f) for f in _FIELDS} == before
    assert "a" in table and "b" not in table and list(table) == ["a"]


@pytest.mark.parametrize(("node", "error"), [
    ("n0", None),
    ("n1", "never placed there"),
])
def test_a_packed_record_still_knows_its_hosts(node: str, error: str | None) -> None:
    table = JobTable()
    _finished(table, make_job("a").build())
    table.pack_ended()
    if error is None:
        table.check_host("a", node)
    else:
        with pytest.raises(ValueError, match=error):
            table.check_host("a", node)


def test_active_and_waiting_records_are_not_packed() -> None:
    table = JobTable()
    _finished(table, make_job("a").build())
    waiting = table.add(make_job("b").build(), 0.0)
    table.transition(waiting, JobState.QUEUED, causes.ADMITTED, 0.0)
    table.pack_ended()
    assert table["b"] is waiting
    assert [table[j].admitted for j in table] == [0, 1]  # admission order kept


@pytest.mark.parametrize("trace", [
    "muri/trace1", "tiresias/60_job", "elasticflow/resnet_cifar", "itp/cluster10",
    "pollux/workload-8", "gavel/msr/ee9e8c", "gavel/physical/small_test",
])
def test_every_bundled_format_s_specs_survive_packing(trace: str) -> None:
    """Equal specs after the JSON round trip: a resubmission is compared with the unpacked
    one, and status rows read it."""
    for spec in load_trace(trace).jobs[:200]:
        assert JobSpec.model_validate_json(spec.model_dump_json(exclude_defaults=True)) == spec


@pytest.mark.parametrize("marks", [(100.0,), (1 / 3, 50.0, 100.0), (99.99999999999999,)])
def test_a_spec_that_replays_failures_survives_packing(marks: tuple[float, ...]) -> None:
    spec = make_job("j").build().model_copy(update={"fail_at": marks})
    spec = JobSpec.model_validate(spec.model_dump())  # checked, as a reader builds it
    table = JobTable()
    _finished(table, spec)
    table.pack_ended()
    assert table["j"].spec == spec and table["j"].spec.fail_at == marks


@settings(max_examples=200, deadline=None)
@given(iterations=st.integers(1, 10**12), step=st.floats(1e-9, 1e6, allow_nan=False),
       submit=st.floats(0, 1e11, allow_nan=False), gpus=st.integers(1, 4096),
       weight=st.floats(1e-6, 1e6, allow_nan=False))
def test_any_spec_survives_packing(iterations: int, step: float, submit: float, gpus: int,
                                   weight: float) -> None:
    spec = (make_job("j").gpus(gpus).iterations(iterations).iteration_time(step).submit(submit)
            .weight(weight).build())
    table = JobTable()
    _finished(table, spec)
    table.pack_ended()
    assert table["j"].spec == spec


@pytest.mark.parametrize(("groups", "busy", "irregular"), [
    pytest.param({"a": (), "b": ()}, 4, set(), id="alone"),
    pytest.param({"a": ("a", "b"), "b": ("a", "b")}, 2, {"a", "b"}, id="sharing-the-same-gpus"),
    pytest.param({"a": ("a", "b"), "b": ()}, 4, {"a"}, id="one-group-one-alone"),
])
def test_busy_gpus_count_each_gpu_once(groups: dict[str, tuple[str, ...]], busy: int,
                                       irregular: set[str]) -> None:
    """Two 2-GPU jobs; a co-located pair shares one set of GPUs (a walk may not simply give
    each its GPUs back: irregular). A job that stops or moves is counted anew."""
    table = JobTable()
    for jid, group in groups.items():
        rec = table.add(make_job(jid).gpus(2).build(), 0.0)
        rec.place((("n0", (0, 1) if group or jid == "a" else (2, 3)),))
        rec.group = group
        table.set_running(rec)
        table.placed(rec)
    assert (table.busy_gpus(), table.irregular()) == (busy, irregular)
    b = table["b"]
    b.place((("n1", (0, 1)),))
    b.group = ()
    table.placed(b)  # moved alone to another node
    assert (table.busy_gpus(), table.irregular()) == (4, irregular - {"b"})
    table.clear_running("a")
    assert (table.busy_gpus(), table.irregular()) == (2, set())


def test_a_job_on_other_than_its_gangs_gpu_count_is_irregular_until_placed_as_asked() -> None:
    """An elastic policy may run a 4-GPU job on 2 GPUs; a walk would place it on 4."""
    table = JobTable()
    rec = table.add(make_job("a").gpus(4).build(), 0.0)
    rec.place((("n0", (0, 1)),))
    table.set_running(rec)
    table.placed(rec)
    assert table.irregular() == {"a"}
    rec.place((("n0", (0, 1, 2, 3)),))
    table.placed(rec)
    assert table.irregular() == set()


def test_a_running_jobs_spec_is_read_without_charging_it() -> None:
    """A walk re-places running jobs from their specs (`RunningJobs.spec_of`): only running
    jobs have one there, and reading it leaves the job's charges as they were."""
    table = JobTable()
    a, b = make_job("a").gpus(2).build(), make_job("b").build()
    rec = table.add(a, 0.0)
    table.add(b, 0.0)
    table.set_running(rec)
    synced = rec.synced
    assert (table.running_spec("a"), table.running_spec("b"),
            table.running_spec("gone")) == (a, None, None)
    assert rec.synced == synced
    table.clear_running("a")
    assert table.running_spec("a") is None


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["start", "start", "stop"]), st.integers(0, 5)),
                      max_size=40),
       asked=st.sets(st.integers(0, 6)))
def test_running_jobs_are_put_in_order_as_a_scan_of_the_running_set_would(
        steps: list[tuple[str, int]], asked: set[int]) -> None:
    """`in_running_order` sorts only the jobs asked for (a plan's preempted ones) by when they
    started: the order of `running` itself, through stops, restarts and a start told twice."""
    table = JobTable()
    recs = [table.add(make_job(f"j{i}").build(), 0.0) for i in range(6)]
    for op, i in steps:
        if op == "start":
            table.set_running(recs[i])  # a running job started again keeps its place
        elif f"j{i}" in table.running:
            table.clear_running(f"j{i}")
    wanted = {f"j{i}" for i in asked}  # j6 never exists
    assert table.in_running_order(wanted) == [j for j in table.running if j in wanted]


def test_a_running_job_told_again_by_another_record_keeps_its_place() -> None:
    table = JobTable()
    a, b = (table.add(make_job(j).build(), 0.0) for j in "ab")
    table.set_running(a)
    table.set_running(b)
    table.set_running(JobRecord(b.spec, b.admitted))  # a record rebuilt for a job that runs
    assert table.in_running_order(["b", "a"]) == ["a", "b"] == list(table.running)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["cycle", "cycle", "read", "left", "stop"]),
                                st.integers(0, 2), st.floats(0.1, 400.0)),
                      min_size=1, max_size=40),
       catch_up=st.sampled_from([2, 3, 64]))
def test_cycles_charged_lazily_give_the_figures_of_an_eager_charge(
        steps: list[tuple[str, int, float]], catch_up: int) -> None:
    """Three running jobs, cycles at growing times, reads and stops in between: what a read
    or a stop finds is bit for bit what charging every running job at every cycle gives, as
    is the time left a walk reads without a view (`running_left`)."""
    table = JobTable()
    eager: dict[str, JobRecord] = {}
    for i in range(3):
        spec = make_job(f"j{i}").gpus(1).runs_for(5000 * (i + 1)).build()
        rec = table.add(spec, 0.0)
        table.transition(rec, JobState.QUEUED, causes.ADMITTED, 0.0)
        table.set_running(rec)
        rec.run = RunProgress(total=spec.iterations, remaining=spec.iterations, at=0.0,
                              ready_at=5.0 * i, iteration_s=spec.iteration_time_s,
                              per_event_s=7.0 * i)
        eager[spec.job_id] = copy.deepcopy(rec)
    fields = ("iterations_done", "attained_s", "accounted_at")
    now = 0.0
    with pytest.MonkeyPatch.context() as m:
        m.setattr("services.scheduler.jobs.CATCH_UP_CYCLES", catch_up)
        for what, i, dt in steps:
            jid = f"j{i}"
            if what == "cycle":
                now += dt
                table.log_cycle(now)
                for twin in eager.values():
                    assert twin.run is not None
                    twin.account(now, twin.run.per_event_s)
                continue
            if jid not in eager:
                continue
            if what == "left":
                assert table.running_left(jid) == (eager[jid].spec, eager[jid].view().remaining_s)
                continue
            got = table[jid] if what == "read" else table.clear_running(jid)
            twin = eager[jid] if what == "read" else eager.pop(jid)
            assert [getattr(got, f) for f in fields] == [getattr(twin, f) for f in fields]
            assert got.run == twin.run
