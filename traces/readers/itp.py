"""Microsoft ITP traces published for ElasticFlow (github.com/microsoft/elasticflow-traces).

Two layouts: `elasticflow-traces/*.csv` (iterations, model, deadline, batch size added by the
ElasticFlow authors) and `raw-traces/*.csv` (job_id, submission_time, duration, num_gpu only).
Raw jobs get one-second synthetic iterations and model "unknown". Times are seconds from the
start of collection; job ids are UUIDs.
"""

from __future__ import annotations

from traces.readers._csv import (
    DURATION_ONLY,
    Parsed,
    Table,
    TraceFormat,
    make_job,
    unit_iterations,
)
from traces.readers.elasticflow import deadline_reader

_RAW_COLUMNS = {
    "job_id": "job_id",
    "gpus": "num_gpu",
    "iterations": "duration",
    "iteration_time_s": "duration",
    "submit_time_s": "submission_time",
    "duration_s": "duration",
}


def read_raw(table: Table) -> Parsed:
    out: Parsed = []
    for row in table.rows():
        duration = row.positive_float("duration")
        iterations, iteration_time = unit_iterations(duration)
        job = make_job(
            row,
            _RAW_COLUMNS,
            job_id=row.text("job_id"),
            submit_time_s=row.non_negative_float("submission_time"),
            duration_s=duration,
            gpus=row.positive_int("num_gpu"),
            model="unknown",
            iterations=iterations,
            iteration_time_s=iteration_time,
        )
        out.append((row.line, job))
    return out


FORMAT = TraceFormat(
    name="itp",
    required=(
        "job_id",
        "submission_time",
        "num_iteration",
        "model_name",
        "deadline",
        "batch_size",
        "num_gpu",
        "duration",
    ),
    optional=(),
    default_overhead="elasticflow",
    read=deadline_reader(submit="submission_time", iterations="num_iteration", deadline="deadline"),
)

RAW_FORMAT = TraceFormat(
    name="itp-raw",
    required=("job_id", "submission_time", "duration", "num_gpu"),
    optional=(),
    default_overhead="elasticflow",
    read=read_raw,
    assumptions=(DURATION_ONLY,),
)
