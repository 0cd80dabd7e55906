"""Alibaba PAI (NSDI'22): `cluster-trace-gpu-v2020` of alibaba/clusterdata (CC-BY-4.0).

Three of its tables matter, each a CSV without a header (the names are in the repository's
README and `*.header` files; a first row spelling them is accepted and skipped):

* `pai_job_table.csv`: job_name, inst_id, user, status, start_time (submission), end_time
* `pai_task_table.csv`: job_name, task_name, inst_num, status, start_time, end_time,
  plan_cpu (percent of a core), plan_mem (GB), plan_gpu (percent of one GPU: 50, 100, 800),
  gpu_type (V100, V100M32, P100, T4, MISC)
* `pai_machine_spec.csv`: machine, gpu_type, cap_cpu, cap_mem, cap_gpu (`machines`)

Times are seconds on the trace's own (shifted) clock. `--trace` names the folder holding the
tables, or the job or task table itself (the other must sit beside it under its published
name). The two tables are joined on job_name: the job table gives the user (the tenant) and
the submission time, the task table everything else, and each task that asks for whole GPUs
becomes one job, `<job_name>.<task_name>`, with inst_num x plan_gpu / 100 GPUs of its
gpu_type, running end_time - start_time seconds (one-second synthetic iterations, model
"unknown"); its status is kept for `--trace-filter state=`. A PS/worker job thus gives one
job for its GPU workers, and its parameter servers (no GPUs) are left out. A task whose
status is `Failed` finishes after its run time like the others, unless the run replays
failures (`load_trace(..., replay_failures=True)`): then it fails for good at that time.

Left out, and counted by reason: tasks asking for a fraction of a GPU (plan_gpu not a
multiple of 100: Loom does not share GPUs fractionally, and rounding would invent or drop
capacity), tasks without GPUs, tasks that never started or were still running, zero-second
tasks and tasks whose job is not in the job table. The job table is held in memory while the
task table streams past it (about 200 bytes a job).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from schemas.job import Name
from traces.errors import TraceError
from traces.readers._csv import DURATION_ONLY, unit_iterations
from traces.readers._stream import (
    NEVER_STARTED,
    NO_END,
    NO_GPUS,
    ZERO_DURATION,
    Candidate,
    Clock,
    Scan,
    StreamFormat,
    csv_rows,
    failure_marks,
    first_row,
    optional_amount,
)
from traces.readers.philly_log import Machine

JOB_TABLE = "pai_job_table.csv"
TASK_TABLE = "pai_task_table.csv"
MACHINE_SPEC = "pai_machine_spec.csv"
JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
MACHINE_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")
FRACTIONAL = "fractional GPU request (plan_gpu not a multiple of 100)"
NO_JOB_ROW = "task of a job missing from the job table"
FAILED = "Failed"  # a task's status when it failed (Terminated: it ended otherwise)
_FIELDS = {"job_id": "task_name", "gpus": "plan_gpu", "gpu_type": "gpu_type",
           "iterations": "end_time", "iteration_time_s": "end_time", "duration_s": "end_time",
           "fail_at": "status"}
_MACHINE_FIELDS = {"node_id": "machine", "gpus": "cap_gpu", "gpu_type": "gpu_type",
                   "cpus": "cap_cpu", "mem_gb": "cap_mem"}
_NAME: TypeAdapter[str] = TypeAdapter(Name)
ASSUMPTIONS = (
    DURATION_ONLY,
    "Alibaba PAI: each whole-GPU task is a job of its gpu_type (run it on the machine table's "
    "cluster); fractional-GPU tasks are left out, not rounded; the user is the tenant",
)
FAILURES = (
    "failures not replayed: Failed tasks run for their recorded time and finish",
    "failures replayed: Failed tasks run for their recorded time and fail for good",
)


def _numeric(text: str, empty_ok: bool = False) -> bool:
    if not text:
        return empty_ok
    try:
        float(text)
    except ValueError:
        return False
    return True


def _shape(row: list[str] | None) -> str | None:
    """Which PAI table a first row belongs to ("job", "task", "machine"), judged by its width
    and which cells are numbers, or by its being the header; None: none of them."""
    if row is None:
        return None
    for kind, names in (("job", JOB_COLUMNS), ("task", TASK_COLUMNS),
                        ("machine", MACHINE_COLUMNS)):
        if tuple(row) == names:
            return kind
    if len(row) == len(JOB_COLUMNS) and not _numeric(row[3]) and _numeric(row[4]) \
            and _numeric(row[5], empty_ok=True):
        return "job"
    if len(row) == len(TASK_COLUMNS) and _numeric(row[2]) and not _numeric(row[3]) \
            and all(_numeric(v, empty_ok=True) for v in row[4:9]):
        return "task"
    if len(row) == len(MACHINE_COLUMNS) and not _numeric(row[1]) \
            and all(_numeric(v) for v in row[2:]):
        return "machine"
    return None


def tables(path: Path) -> tuple[Path, Path] | None:
    """(job table, task table) for a folder holding both or for either table; None when
    `path` is neither. A table whose partner is missing is a TraceError."""
    if path.is_dir():
        job, task = path / JOB_TABLE, path / TASK_TABLE
        if job.is_file() and task.is_file():
            return job, task
        if job.is_file() or task.is_file():
            missing = TASK_TABLE if job.is_file() else JOB_TABLE
            raise TraceError(path, None, None, f"holds an Alibaba PAI table but no {missing}")
        return None
    kind = _shape(first_row(path))
    if kind not in ("job", "task"):
        return None
    other = path.parent / (TASK_TABLE if kind == "job" else JOB_TABLE)
    if not other.is_file():
        raise TraceError(path, None, None,
                         f"is an Alibaba PAI {kind} table; the {'task' if kind == 'job' else 'job'}"
                         f" table must sit beside it as {other.name}, and {other} does not exist")
    return (path, other) if kind == "job" else (other, path)


def scan(path: Path) -> Scan:
    found = tables(path)
    if found is None:
        raise TraceError(path, None, None, "not an Alibaba PAI job or task table")
    job_table, task_table = found
    clock = Clock()
    jobs: dict[str, tuple[str, float]] = {}
    users: dict[str, str] = {}
    for row in csv_rows(job_table, JOB_COLUMNS):
        name = row.text("job_name")
        user = row.text("user")
        row.text("status")
        submit = clock.seconds(row, "start_time", row.text("start_time"))
        clock.cell(row, "end_time")
        if name in jobs:
            raise row.error("job_name", f"job {name!r} appears twice in the job table")
        if user not in users:
            try:
                users[user] = _NAME.validate_python(user)
            except ValidationError as exc:
                message = exc.errors(include_url=False)[0]["msg"]
                raise row.error("user", f"{message}, got {user!r} (users are tenants)") from None
        jobs[name] = (users[user], submit)
    for row in csv_rows(task_table, TASK_COLUMNS):
        name = row.text("job_name")
        task = row.text("task_name")
        instances = row.positive_int("inst_num")
        state = row.text("status")
        start = clock.cell(row, "start_time")
        end = clock.cell(row, "end_time")
        optional_amount(row, "plan_cpu")
        optional_amount(row, "plan_mem")
        plan_gpu = optional_amount(row, "plan_gpu")
        gpu_type = row.cell("gpu_type") or None
        job = jobs.get(name)
        if job is None:
            yield NO_JOB_ROW
        elif not plan_gpu:
            yield NO_GPUS
        elif plan_gpu % 100:
            yield FRACTIONAL
        elif start is None:
            yield NEVER_STARTED
        elif end is None:
            yield NO_END
        elif end < start:
            raise row.error("end_time", "is before start_time")
        elif end == start:
            yield ZERO_DURATION
        else:
            duration = end - start
            iterations, iteration_time = unit_iterations(duration)
            yield Candidate(row, job[1], state, {
                "job_id": f"{name}.{task}", "tenant": job[0], "model": "unknown",
                "gpus": instances * round(plan_gpu) // 100, "gpu_type": gpu_type,
                "iterations": iterations, "iteration_time_s": iteration_time,
                "duration_s": duration}, _FIELDS,
                fail_at=failure_marks((), state == FAILED, duration, iterations))


FORMAT = StreamFormat(
    name="alibaba-pai",
    default_overhead="flat:30",
    scan=scan,
    assumptions=ASSUMPTIONS,
    failures=FAILURES,
)


def is_machine_spec(path: Path) -> bool:
    return path.is_file() and _shape(first_row(path)) == "machine"


def machines(path: Path) -> list[Machine]:
    """PAI's GPU machines: name, GPU type, CPU cores, memory (GB) and GPUs. Machines without
    GPUs (cap_gpu 0) are left out: Loom places GPU jobs only."""
    out: list[Machine] = []
    for row in csv_rows(path, MACHINE_COLUMNS):
        node_id = row.text("machine")
        gpu_type = row.text("gpu_type")
        cpus = row.non_negative_int("cap_cpu")
        mem_gb = row.non_negative_float("cap_mem")
        gpus = row.non_negative_int("cap_gpu")
        if gpus:
            out.append(Machine(row, node_id, gpus, gpu_type, cpus, mem_gb, _MACHINE_FIELDS))
    return out
