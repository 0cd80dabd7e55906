"""Helios (SenseTime, SC'21): the job logs of the Earth, Saturn, Uranus and Venus clusters.

Published in S-Lab-System-Group/HeliosData (`data.zip`, CC-BY-4.0), one folder per cluster.
`cluster_log.csv` has one row per Slurm job: job_id, user, vc (virtual cluster), gpu_num,
cpu_num, node_num, state (COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, ...),
submit_time, start_time, end_time (date-times or epoch seconds, one kind per file),
duration (s), queue (s). A `jobname` column, where a copy has one, is accepted and ignored.

Each job that ran becomes a JobSpec: `job_id` as is, the VC is its tenant, `gpu_num` its GPUs,
`duration` (else end_time - start_time) its run time at those GPUs, as one-second synthetic
iterations (`unit_iterations`), model "unknown". Submission times count from the earliest
submission of a job that ran. Left out, and counted by reason: CPU-only jobs (gpu_num 0), jobs
without a start_time (cancelled or failed while queued), jobs without an end time or duration
(still running when the log was cut) and jobs that ran for zero seconds. A job that ran
finishes after its recorded time whatever its state, unless the run replays failures
(`load_trace(..., replay_failures=True)`): then state FAILED fails it for good at that time
(CANCELLED, TIMEOUT, NODE_FAIL still finish: stopped, not failed on its own). user, cpu_num,
node_num and queue are checked and not used (Loom places GPUs, and queueing is what the
simulation works out).

`cluster_gpu_number.csv` (date, then the GPUs of each VC that day) gives each VC's share of
the cluster; `gpu_numbers` reads it for `traces.tenants`.
"""

from __future__ import annotations

from pathlib import Path

from traces.errors import TraceError
from traces.readers._csv import DURATION_ONLY, unit_iterations
from traces.readers._stream import (
    Candidate,
    Clock,
    Scan,
    StreamFormat,
    csv_rows,
    failure_marks,
    optional_amount,
    optional_count,
    recorded_run,
)

LOG = "cluster_log.csv"
COLUMNS = ("job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time",
           "start_time", "end_time", "duration", "queue")
FAILED = "FAILED"  # Slurm's state of a job that failed on its own
_FIELDS = {"job_id": "job_id", "tenant": "vc", "gpus": "gpu_num", "iterations": "duration",
           "iteration_time_s": "duration", "duration_s": "duration", "fail_at": "state"}
ASSUMPTIONS = (
    DURATION_ONLY,
    "Helios: vc is the tenant; CPU-only jobs and jobs that never started are left out",
)
FAILURES = (
    "failures not replayed: FAILED jobs run for their recorded time and finish",
    "failures replayed: FAILED jobs run for their recorded time and fail for good",
)


def scan(path: Path) -> Scan:
    clock = Clock()
    for row in csv_rows(path):
        job_id = row.text("job_id")
        row.text("user")
        tenant = row.text("vc")
        gpus = row.non_negative_int("gpu_num")
        optional_count(row, "cpu_num")
        optional_count(row, "node_num")
        state = row.text("state")
        submit = clock.seconds(row, "submit_time", row.text("submit_time"))
        start = clock.cell(row, "start_time")
        end = clock.cell(row, "end_time")
        duration = optional_amount(row, "duration")
        optional_amount(row, "queue")
        ran = recorded_run(row, gpus, start, end, duration)
        if isinstance(ran, str):
            yield ran
            continue
        iterations, iteration_time = unit_iterations(ran)
        yield Candidate(row, submit, state, {
            "job_id": job_id, "tenant": tenant, "model": "unknown", "gpus": gpus,
            "iterations": iterations, "iteration_time_s": iteration_time,
            "duration_s": ran}, _FIELDS,
            fail_at=failure_marks((), state == FAILED, ran, iterations))


FORMAT = StreamFormat(
    name="helios",
    default_overhead="flat:30",
    scan=scan,
    assumptions=ASSUMPTIONS,
    failures=FAILURES,
    required=COLUMNS,
    optional=("jobname",),
)


def gpu_numbers(path: Path, date: str | None = None) -> tuple[str, dict[str, int]]:
    """(the day, GPUs of each VC that day) from a Helios `cluster_gpu_number.csv`.

    `date` picks the row whose date cell is exactly that text; None takes the last row (the
    cluster as the log ends). Empty cells are VCs absent that day; they are left out.
    """
    chosen: tuple[str, dict[str, int]] | None = None
    vcs: tuple[str, ...] = ()
    for row in csv_rows(path):
        if not vcs:
            vcs = tuple(c for c in row.columns if c != "date")
            if not vcs or "date" not in row.columns:
                raise TraceError(path, 1, None,
                                 "expected a 'date' column and one column per VC")
        day = row.text("date")
        counts = {vc: n for vc in vcs if (n := optional_count(row, vc)) is not None}
        if date is None or day == date:
            chosen = (day, counts)
            if date is not None:
                break
    if chosen is None:
        where = f"no row for {date!r}" if date is not None else "no data rows"
        raise TraceError(path, None, "date" if date is not None else None, where)
    return chosen

