"""Muri (SIGCOMM'22) job traces: simulator `trace-data/*.csv` and the testbed `cluster_trace.csv`.

Times are milliseconds in the file (`submit_time`, `duration`, `interval`) and milliseconds per
iteration for `iteration_time` and the three `resource_time_*` stages (data loading, GPU
compute, gradient communication). Muri's simulator multiplies iteration times by 1.015 to
calibrate against its testbed; that belongs to the overhead model, so it is not applied here.
"""

from __future__ import annotations

from traces.errors import TraceError
from traces.readers._csv import MS_PER_S, Parsed, Table, TraceFormat, make_job

STAGES = ("resource_time_0", "resource_time_1", "resource_time_2")

_COLUMNS = {
    "job_id": "job_id",
    "model": "model_name",
    "batch_size": "batch_size",
    "gpus": "num_gpu",
    "iterations": "iterations",
    "iteration_time_s": "iteration_time",
    "stage_times_s": "resource_time_0",
    "priority": "priority",
    "submit_time_s": "submit_time",
    "duration_s": "duration",
}


def read(table: Table) -> Parsed:
    present = [c for c in STAGES if c in table.index]
    if present and len(present) != len(STAGES):
        missing = next(c for c in STAGES if c not in table.index)
        # Muri invents random stage splits when the columns are absent; half a split is a typo.
        raise TraceError(table.path, 1, missing, "resource_time_* columns must all be present")
    has_priority = "priority" in table.index
    out: Parsed = []
    for row in table.rows():
        stages = None
        if present:
            stages = tuple(row.non_negative_float(c) / MS_PER_S for c in STAGES)
        job = make_job(
            row,
            _COLUMNS,
            job_id=row.text("job_id"),
            gpus=row.positive_int("num_gpu"),
            submit_time_s=row.non_negative_float("submit_time") / MS_PER_S,
            iterations=row.positive_int("iterations"),
            model=row.text("model_name"),
            batch_size=row.positive_int("batch_size"),
            duration_s=row.non_negative_float("duration") / MS_PER_S,
            iteration_time_s=row.positive_float("iteration_time") / MS_PER_S,
            stage_times_s=stages,
            priority=row.non_negative_int("priority") if has_priority else 0,
        )
        row.non_negative_float("interval")  # gap to the previous submission: checked, unused
        out.append((row.line, job))
    return out


FORMAT = TraceFormat(
    name="muri",
    required=(
        "job_id",
        "num_gpu",
        "submit_time",
        "iterations",
        "model_name",
        "batch_size",
        "duration",
        "interval",
        "iteration_time",
    ),
    optional=(*STAGES, "priority"),
    default_overhead="muri",
    read=read,
)
