"""Replaying the failures production traces record (`replay_failures`, `loom sim
--replay-failures`): the marks each reader gives a job, what the trace says of them, and
nothing at all without the flag."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.traces.builders import write_trace
from tests.traces.production_builders import (
    attempt,
    philly_job,
    write_acme,
    write_helios,
    write_pai,
    write_philly_log,
)
from traces import load_trace
from traces.errors import TraceError
from traces.readers._csv import DURATION_ONLY
from traces.readers._stream import failure_marks

_T0 = datetime(2017, 10, 3, 6, 40, 0)


def _stamp(seconds: float) -> str:
    return (_T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")


def attempts(*lengths: float | None, gap: float = 60.0) -> list[dict[str, Any]]:
    """Philly attempts one after another, each running `length` seconds (None: queued, never
    started), `gap` seconds apart."""
    out, at = [], 0.0
    for length in lengths:
        if length is None:
            out.append(attempt(None, None))
            continue
        out.append(attempt(_stamp(at), _stamp(at + length)))
        at += length + gap
    return out


# (status, attempts' run times, marks): run times add up to the duration, one-second
# iterations, so a mark is the run time (s) at which a run failed.
PHILLY = [
    ("Pass", (3600,), None),
    ("Failed", (3600,), (3600.0,)),
    ("Killed", (3600,), None),  # a user's kill: the job completes
    ("Pass", (100, 200, 300), (100.0, 300.0)),  # restarted twice, then passed
    ("Failed", (100, 200, 300), (100.0, 300.0, 600.0)),  # ... then failed for good
    ("Killed", (100, 200, 300), (100.0, 300.0)),
    ("Pass", (100, 0, 300), (100.0,)),  # an attempt that ran no time repeats its mark
    ("Pass", (0, 300), None),  # ... and one at the start is no failure of the run
    ("Failed", (100, 300, 0), (100.0, 400.0)),  # ... nor one at the end a second failure
    ("Pass", (100, None, 300), (100.0,)),  # an attempt that never started is no run
]


@pytest.mark.parametrize(("status", "runs", "marks"), PHILLY,
                         ids=[f"{s}-{'+'.join(map(str, r))}" for s, r, _ in PHILLY])
def test_philly_marks_each_restart_and_a_final_failure(
        tmp_path: Path, status: str, runs: tuple[float | None, ...],
        marks: tuple[float, ...] | None) -> None:
    path = write_philly_log(tmp_path, [philly_job(0, status=status, attempts=attempts(*runs))])
    (job,) = load_trace(path, replay_failures=True).jobs
    assert job.duration_s == sum(r or 0 for r in runs)
    assert job.fail_at == marks
    (plain,) = load_trace(path).jobs
    assert plain.fail_at is None and plain == job.model_copy(update={"fail_at": None})


def test_a_final_mark_of_a_fractional_duration_is_the_end(tmp_path: Path) -> None:
    path = write_acme(tmp_path, [{"state": "FAILED", "duration": "22.4"}])
    (job,) = load_trace(path, replay_failures=True).jobs
    assert (job.iterations, job.fail_at) == (22, (22.0,))  # 22 iterations of 22.4/22 s
    assert 22.0 * job.iteration_time_s == pytest.approx(22.4)


@pytest.mark.parametrize(("write", "state", "failed"), [
    (lambda d, rows: write_acme(d, rows), "FAILED", True),
    (lambda d, rows: write_acme(d, rows, kalos=True), "FAILED", True),
    (lambda d, rows: write_acme(d, rows), "COMPLETED", False),
    (lambda d, rows: write_acme(d, rows), "CANCELLED", False),
    (lambda d, rows: write_acme(d, rows), "TIMEOUT", False),
    (lambda d, rows: write_helios(d, rows), "FAILED", True),
    (lambda d, rows: write_helios(d, rows), "NODE_FAIL", False),
    (lambda d, rows: write_helios(d, rows), "COMPLETED", False),
], ids=["acme-seren-FAILED", "acme-kalos-FAILED", "acme-COMPLETED", "acme-CANCELLED",
        "acme-TIMEOUT", "helios-FAILED", "helios-NODE_FAIL", "helios-COMPLETED"])
def test_csv_logs_fail_their_failed_jobs_at_the_recorded_time(
        tmp_path: Path, write: Any, state: str, failed: bool) -> None:
    path = write(tmp_path, [{"state": state}])
    (job,) = load_trace(path, replay_failures=True).jobs
    assert job.fail_at == ((float(job.iterations),) if failed else None)
    assert job.iterations * job.iteration_time_s == job.duration_s  # at the recorded time
    assert load_trace(path).jobs[0].fail_at is None


@pytest.mark.parametrize(("status", "marks"), [("Failed", (3400.0,)), ("Terminated", None)])
def test_pai_failed_tasks_fail_at_their_recorded_time(
        tmp_path: Path, status: str, marks: tuple[float, ...] | None) -> None:
    write_pai(tmp_path, jobs=[{}], tasks=[{"status": status}])  # 3,400 s of run
    (job,) = load_trace(str(tmp_path), replay_failures=True).jobs
    assert job.fail_at == marks


def test_the_trace_counts_its_failures_and_says_whether_they_are_replayed(
        tmp_path: Path) -> None:
    path = write_philly_log(tmp_path, [
        philly_job(0, status="Failed", attempts=attempts(100, 200)),  # 2 failures
        philly_job(1, status="Pass", attempts=attempts(100, 200, 300)),  # 2 restarts
        philly_job(2, status="Killed", attempts=attempts(50)),
        philly_job(3, status="Failed", vc="other", attempts=attempts(50, 50)),
    ])
    replayed = load_trace(path, replay_failures=True)
    plain = load_trace(path)
    assert (replayed.replay_failures, replayed.failures, replayed.restarts) == (True, 6, 4)
    assert (plain.replay_failures, plain.failures) == (False, 6)  # recorded all the same
    assert replayed.assumptions[0] == plain.assumptions[0] == DURATION_ONLY
    assert replayed.assumptions[-1].startswith("failures replayed")
    assert plain.assumptions[-1].startswith("failures not replayed")
    kept = load_trace(path, replay_failures=True, trace_filter="vc=ee9e8c")
    assert kept.failures == 4 and kept.job_count == 3
    assert [j.fail_at for j in kept.iter_jobs()] == [(100.0, 300.0), (100.0, 300.0), None]


@pytest.mark.parametrize("fmt", ["acme", "helios", "alibaba-pai", "philly-log"])
def test_every_production_format_says_what_becomes_of_its_failures(
        tmp_path: Path, fmt: str) -> None:
    path = {"acme": lambda: write_acme(tmp_path, [{}]),
            "helios": lambda: write_helios(tmp_path, [{}]),
            "alibaba-pai": lambda: write_pai(tmp_path, jobs=[{}], tasks=[{}]),
            "philly-log": lambda: write_philly_log(tmp_path, [philly_job(0)])}[fmt]()
    for replay, says in ((False, "failures not replayed"), (True, "failures replayed")):
        trace = load_trace(path, replay_failures=replay)
        assert trace.format == fmt
        assert trace.assumptions[0] == DURATION_ONLY
        assert sum(a.startswith(says) for a in trace.assumptions) == 1


@pytest.mark.parametrize("dialect", ["philly", "itp-raw"])
def test_the_older_duration_only_readers_state_the_shared_assumption(
        tmp_path: Path, dialect: str) -> None:
    trace = load_trace(write_trace(tmp_path, dialect, [{}]))
    assert trace.assumptions == (DURATION_ONLY,)


@pytest.mark.parametrize("trace", ["tiresias/60_job", "muri/trace1"])
def test_a_trace_that_records_no_failures_refuses_to_replay_them(trace: str) -> None:
    with pytest.raises(TraceError, match="records no failures to replay; drop "
                                         "--replay-failures"):
        load_trace(trace, replay_failures=True)


@pytest.mark.parametrize(("restarted_at", "failed", "duration", "iterations", "marks"), [
    ((), False, 100.0, 100, ()),
    ((), True, 100.0, 100, (100.0,)),
    ((30.0, 60.0), False, 100.0, 100, (30.0, 60.0)),
    ((30.0, 30.0, 100.0), True, 100.0, 100, (30.0, 100.0)),  # repeated, or at the end: dropped
    ((0.0, 50.0), False, 50.0, 25, ()),  # nothing strictly inside the run
    ((25.0,), True, 50.0, 25, (12.5, 25.0)),  # 2 s iterations
])
def test_failure_marks(restarted_at: tuple[float, ...], failed: bool, duration: float,
                       iterations: int, marks: tuple[float, ...]) -> None:
    assert failure_marks(restarted_at, failed, duration, iterations) == marks
