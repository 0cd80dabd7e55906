"""The Philly job list Pollux ships (`simulator/traces/philly.csv`).

Columns: timestamp (naive local date-time), duration (s), num_gpus, gpu_time (= duration x
num_gpus, redundant) and cluster (Philly virtual cluster, used as the tenant). Rows are not in
time order, so submission times are offsets from the earliest timestamp in the file. Jobs have
no id, model or iteration count: ids are `philly-<line>`, the model is "unknown" and
iterations are synthetic one-second steps. Pollux charges a flat 30 s per restart.
"""

from __future__ import annotations

from datetime import datetime

from traces.readers._csv import (
    DURATION_ONLY,
    Parsed,
    Row,
    Table,
    TraceFormat,
    make_job,
    unit_iterations,
)

_COLUMNS = {
    "tenant": "cluster",
    "gpus": "num_gpus",
    "iterations": "duration",
    "iteration_time_s": "duration",
    "submit_time_s": "timestamp",
    "duration_s": "duration",
}


def read(table: Table) -> Parsed:
    # Two passes: offsets need the earliest timestamp, which may sit on any row.
    checked: list[tuple[Row, datetime, float, int, str]] = []
    for row in table.rows():
        stamp = row.timestamp("timestamp")
        duration = row.positive_float("duration")
        gpus = row.positive_int("num_gpus")
        row.non_negative_float("gpu_time")
        checked.append((row, stamp, duration, gpus, row.text("cluster")))
    if not checked:
        return []
    start = min(stamp for _, stamp, _, _, _ in checked)
    out: Parsed = []
    for row, stamp, duration, gpus, tenant in checked:
        iterations, iteration_time = unit_iterations(duration)
        job = make_job(
            row,
            _COLUMNS,
            job_id=f"philly-{row.line}",
            tenant=tenant,
            model="unknown",
            gpus=gpus,
            iterations=iterations,
            iteration_time_s=iteration_time,
            submit_time_s=(stamp - start).total_seconds(),
            duration_s=duration,
        )
        out.append((row.line, job))
    return out


FORMAT = TraceFormat(
    name="philly",
    required=("timestamp", "duration", "num_gpus", "gpu_time", "cluster"),
    optional=(),
    default_overhead="flat:30",
    read=read,
    assumptions=(DURATION_ONLY,),
)
