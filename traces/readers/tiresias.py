"""Tiresias (NSDI'19) job traces such as `60_job.csv`; all times in seconds.

The file has no per-iteration time, so it is derived as duration / iterations. The Tiresias
simulator charges no preemption overhead, hence the "none" default.
"""

from __future__ import annotations

from traces.readers._csv import Parsed, Table, TraceFormat, make_job

_COLUMNS = {
    "job_id": "job_id",
    "model": "model_name",
    "gpus": "num_gpu",
    "iterations": "iterations",
    "iteration_time_s": "duration",
    "submit_time_s": "submit_time",
    "duration_s": "duration",
}


def read(table: Table) -> Parsed:
    out: Parsed = []
    for row in table.rows():
        iterations = row.positive_int("iterations")
        duration = row.positive_float("duration")
        job = make_job(
            row,
            _COLUMNS,
            job_id=row.text("job_id"),
            gpus=row.positive_int("num_gpu"),
            submit_time_s=row.non_negative_float("submit_time"),
            iterations=iterations,
            model=row.text("model_name"),
            duration_s=duration,
            iteration_time_s=duration / iterations,
        )
        row.non_negative_float("interval")  # gap to the next submission: checked, unused
        out.append((row.line, job))
    return out


FORMAT = TraceFormat(
    name="tiresias",
    required=(
        "job_id",
        "num_gpu",
        "submit_time",
        "iterations",
        "model_name",
        "duration",
        "interval",
    ),
    optional=(),
    default_overhead="none",
    read=read,
)
