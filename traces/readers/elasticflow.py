"""ElasticFlow (ASPLOS'23) traces from `traces_for_ElasticFlow/`; all times in seconds.

`ddl` is an absolute deadline. `philly_103959.csv` adds `real_iteration`/`real_duration`;
like ElasticFlow's scheduler we use `iteration` and `duration` and only check the others.
The deadline-trace logic is shared with the ITP reader, which names the same fields differently.
"""

from __future__ import annotations

from collections.abc import Callable

from traces.readers._csv import Parsed, Table, TraceFormat, make_job

UNUSED = ("real_iteration", "real_duration")


def deadline_reader(submit: str, iterations: str, deadline: str) -> Callable[[Table], Parsed]:
    """A reader for job_id/model_name/batch_size/num_gpu/duration traces with a deadline.

    The arguments are the file's names for submission time, iteration count and deadline.
    """
    columns = {
        "job_id": "job_id",
        "model": "model_name",
        "batch_size": "batch_size",
        "gpus": "num_gpu",
        "iterations": iterations,
        "iteration_time_s": "duration",
        "deadline_s": deadline,
        "best_effort": "best_effort",
        "submit_time_s": submit,
        "duration_s": "duration",
    }

    def read(table: Table) -> Parsed:
        has_best_effort = "best_effort" in table.index
        unused = [c for c in UNUSED if c in table.index]
        out: Parsed = []
        for row in table.rows():
            count = row.positive_int(iterations)
            duration = row.positive_float("duration")
            job = make_job(
                row,
                columns,
                job_id=row.text("job_id"),
                submit_time_s=row.non_negative_float(submit),
                iterations=count,
                model=row.text("model_name"),
                deadline_s=row.non_negative_float(deadline),
                batch_size=row.positive_int("batch_size"),
                gpus=row.positive_int("num_gpu"),
                duration_s=duration,
                iteration_time_s=duration / count,
                best_effort=row.flag("best_effort") if has_best_effort else False,
            )
            for column in unused:
                row.non_negative_float(column)
            out.append((row.line, job))
        return out

    return read


FORMAT = TraceFormat(
    name="elasticflow",
    required=(
        "job_id",
        "submit_time",
        "iteration",
        "model_name",
        "ddl",
        "batch_size",
        "num_gpu",
        "duration",
    ),
    optional=("best_effort", *UNUSED),
    default_overhead="elasticflow",
    read=deadline_reader(submit="submit_time", iterations="iteration", deadline="ddl"),
)
