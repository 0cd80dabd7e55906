"""Philly (Microsoft, 2017): the raw job log of msr-fiddle/philly-traces (CC-BY-4.0).

`trace-data.tar.gz` holds `cluster_job_log`, one JSON list of ~117k jobs:

    {"jobid": "application_1506638472019_10238", "vc": "ee9e8c", "user": "...",
     "status": "Pass" | "Killed" | "Failed", "submitted_time": "2017-10-03 06:39:19",
     "attempts": [{"start_time": "2017-10-03 06:39:26", "end_time": "...",
                   "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}]}, ...]}

(times are date-time strings or null), and `cluster_machine_list`, a CSV of machineId, number
of GPUs, single GPU mem (`machines`).

A job's GPUs are the GPUs listed in the detail of its first attempt that lists any. Each
attempt after the first is a restart (Philly retries failed jobs); the job's duration is the
sum of its attempts' run times (end_time - start_time), so the simulated job uses the GPU time
the real one did, failed attempts included. By default it runs that time once, without the
restarts (the loader counts them in `Trace.restarts`), and finishes whatever its status.
Replaying failures (`load_trace(..., replay_failures=True)`), the job fails at the end of each
attempt that ran but the last (at its run time so far) and is restarted from there, and a
`Failed` job's last run fails for good at its end; `Killed` is a user's kill, not a failure,
so such a job completes. The VC is the tenant; the status is kept for
`--trace-filter state=`; model "unknown", one-second synthetic iterations. Left out, and
counted: jobs with no submitted_time, jobs none of whose attempts started, jobs with no GPUs
listed, jobs still running when the log was cut (an attempt without end_time), and jobs whose
attempts add up to zero seconds. `user` and each detail's `ip` are checked, not used.

This is not the `philly` format, which is the per-job CSV Pollux derived from this log.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from traces.readers._csv import DURATION_ONLY, Row, unit_iterations
from traces.readers._stream import (
    NEVER_STARTED,
    NO_END,
    NO_GPUS,
    ZERO_DURATION,
    Candidate,
    Clock,
    JsonRecord,
    Scan,
    StreamFormat,
    csv_rows,
    failure_marks,
    first_row,
    json_objects,
)

JOB_LOG = "cluster_job_log"
MACHINE_LIST = "cluster_machine_list"
MACHINE_COLUMNS = ("machineId", "number of GPUs", "single GPU mem")
NO_SUBMIT = "no submitted_time"
_MACHINE_FIELDS = {"node_id": "machineId", "gpus": "number of GPUs"}
FAILED = "Failed"  # the status of a job whose last attempt failed (Killed: a user's kill)
_FIELDS = {"job_id": "jobid", "tenant": "vc", "gpus": "attempts", "iterations": "attempts",
           "iteration_time_s": "attempts", "duration_s": "attempts", "fail_at": "attempts"}
ASSUMPTIONS = (
    DURATION_ONLY,
    "Philly log: a job's duration is the sum of its attempts' run times; GPUs are those of "
    "its first attempt; vc is the tenant",
)
FAILURES = (
    "failures not replayed: a job runs its attempts' time once (its restarts are counted, "
    "not replayed) and finishes, Failed or not",
    "failures replayed: a job fails at the end of each attempt but the last and is restarted "
    "from there, as Philly retried it; a Failed job's last run fails for good; Killed jobs "
    "complete",
)


def _text(where: JsonRecord, obj: dict[str, Any], key: str, field: str | None = None) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise where.error(field or key, _expected("a non-empty string", key, obj))
    return value.strip()


def _expected(kind: str, key: str, obj: dict[str, Any]) -> str:
    if key not in obj:
        return f"missing key, expected {kind}"
    return f"expected {kind}, got {obj[key]!r}"


def _time(where: JsonRecord, clock: Clock, obj: dict[str, Any], key: str,
          field: str) -> float | None:
    value = obj.get(key)
    if value is None:
        if key not in obj:
            raise where.error(field, "missing key, expected a date-time or null")
        return None
    if not isinstance(value, str) or not value.strip():
        raise where.error(field, f"expected a date-time or null, got {value!r}")
    return clock.seconds(where, field, value.strip())


def _list(where: JsonRecord, obj: dict[str, Any], key: str, field: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise where.error(field, _expected("a list", key, obj))
    return value


def _object(where: JsonRecord, value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error(field, f"expected an object, got {value!r}")
    return value


def _gpus(where: JsonRecord, attempt: dict[str, Any], index: int) -> int:
    count = 0
    for j, raw in enumerate(_list(where, attempt, "detail", f"attempts[{index}].detail")):
        field = f"attempts[{index}].detail[{j}]"
        detail = _object(where, raw, field)
        _text(where, detail, "ip", f"{field}.ip")
        gpus = _list(where, detail, "gpus", f"{field}.gpus")
        if not all(isinstance(g, str) for g in gpus):
            raise where.error(f"{field}.gpus", f"expected a list of GPU names, got {gpus!r}")
        count += len(gpus)
    return count


def scan(path: Path) -> Scan:
    clock = Clock()
    for where, raw in json_objects(path):
        job = _object(where, raw, "job")
        job_id = _text(where, job, "jobid")
        tenant = _text(where, job, "vc")
        _text(where, job, "user")
        state = _text(where, job, "status")
        submit = _time(where, clock, job, "submitted_time", "submitted_time")
        attempts = _list(where, job, "attempts", "attempts")
        gpus = 0
        started = running = False
        runtime = 0.0
        ends: list[float] = []  # the run time so far at the end of each attempt that ran
        for i, item in enumerate(attempts):
            attempt = _object(where, item, f"attempts[{i}]")
            start = _time(where, clock, attempt, "start_time", f"attempts[{i}].start_time")
            end = _time(where, clock, attempt, "end_time", f"attempts[{i}].end_time")
            listed = _gpus(where, attempt, i)
            if gpus == 0:
                gpus = listed
            if start is None:
                continue
            started = True
            if end is None:
                running = True
            elif end < start:
                raise where.error(f"attempts[{i}].end_time", "is before its start_time")
            else:
                runtime += end - start
                ends.append(runtime)
        if submit is None:
            yield NO_SUBMIT
        elif not started:
            yield NEVER_STARTED
        elif gpus == 0:
            yield NO_GPUS
        elif running:
            yield NO_END
        elif runtime <= 0:
            yield ZERO_DURATION
        else:
            iterations, iteration_time = unit_iterations(runtime)
            # Every attempt but the last ended in a failure Philly retried.
            fail_at = failure_marks(ends[:-1], state == FAILED, runtime, iterations)
            yield Candidate(where, submit, state, {
                "job_id": job_id, "tenant": tenant, "model": "unknown", "gpus": gpus,
                "iterations": iterations, "iteration_time_s": iteration_time,
                "duration_s": runtime}, _FIELDS, restarts=len(attempts) - 1, fail_at=fail_at)


FORMAT = StreamFormat(
    name="philly-log",
    default_overhead="flat:30",
    scan=scan,
    assumptions=ASSUMPTIONS,
    failures=FAILURES,
)


def is_job_log(path: Path) -> bool:
    """Whether the file starts like JSON (a list: Philly's job log is the only JSON trace
    Loom reads; an object is then reported as not being a list)."""
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as f:
            head = f.read(4096).lstrip()
    except OSError:
        return False
    return head.startswith(("[", "{"))


class Machine(NamedTuple):
    """One machine of a production cluster, as its machine table lists it."""

    where: Row
    node_id: str
    gpus: int
    gpu_type: str | None
    cpus: int
    mem_gb: float
    columns: Mapping[str, str]  # NodeSpec field -> column, for errors


def is_machine_list(path: Path) -> bool:
    row = first_row(path)
    return row is not None and tuple(row) == MACHINE_COLUMNS


def machines(path: Path) -> list[Machine]:
    """Philly's machines: id, GPU count (2 or 8) and GPU memory ("24GB" or 24, checked, not
    modelled: Loom's GPUs have no memory size)."""
    out: list[Machine] = []
    for row in csv_rows(path):
        node_id = row.text("machineId")
        gpus = row.non_negative_int("number of GPUs")
        memory = row.text("single GPU mem")
        number = memory.upper().removesuffix("GB").strip()
        try:
            ok = float(number) > 0
        except ValueError:
            ok = False
        if not ok:
            raise row.error("single GPU mem", f"expected a size such as 24GB, got {memory!r}")
        out.append(Machine(row, node_id, gpus, None, 0, 0.0, _MACHINE_FIELDS))
    return out
