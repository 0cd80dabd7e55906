"""Acme (Shanghai AI Lab, NSDI'24): the LLM-development job traces of Seren and Kalos.

Published in InternLM/AcmeTrace (CC-BY-4.0) as `data/job_trace/trace_seren.csv` and
`trace_kalos.csv`: job_id, user, node_num, gpu_num, cpu_num, type (Pretrain, SFT, Eval, MLLM,
Debug, Other), state (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...), submit_time,
start_time, end_time (date-times or epoch seconds, one kind per file), duration (s), queue (s),
gpu_time (GPU-seconds); Kalos adds fail_time and stop_time.

Each job that ran becomes a JobSpec: `job_id` as is, the user is its tenant (the traces have
no virtual clusters), `type` is its `job_type` label (policies and reports may group by it),
`gpu_num` its GPUs, `duration` (else end_time - start_time) its run time at those GPUs, as
one-second synthetic iterations, model "unknown". A failed job keeps its recorded run time,
so it leaves the simulated cluster when it failed in the real one: by default as finished;
replaying failures (`load_trace(..., replay_failures=True)`), state FAILED fails the job for
good at its recorded time (other states, CANCELLED, TIMEOUT, NODE_FAIL, still finish: a
user's or the cluster's stop, not the job's failure). Left out, and counted by reason: CPU-only
jobs, jobs that never started, jobs still running when the trace was cut, and zero-second
jobs. node_num, cpu_num, queue, gpu_time, fail_time and stop_time are checked, not used.
"""

from __future__ import annotations

from pathlib import Path

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

COLUMNS = ("job_id", "user", "node_num", "gpu_num", "cpu_num", "type", "state", "submit_time",
           "start_time", "end_time", "duration", "queue", "gpu_time")
KALOS_COLUMNS = ("fail_time", "stop_time")
FAILED = "FAILED"  # Slurm's state of a job that failed on its own
_FIELDS = {"job_id": "job_id", "tenant": "user", "job_type": "type", "gpus": "gpu_num",
           "iterations": "duration", "iteration_time_s": "duration", "duration_s": "duration",
           "fail_at": "state"}
ASSUMPTIONS = (
    DURATION_ONLY,
    "Acme: the user is the tenant and the job type its job_type",
)
FAILURES = (
    "failures not replayed: FAILED jobs run for their recorded time and finish",
    "failures replayed: FAILED jobs run for their recorded time and fail for good",
)


def scan(path: Path) -> Scan:
    clock = Clock()
    extra: tuple[str, ...] | None = None
    for row in csv_rows(path):
        if extra is None:
            extra = tuple(c for c in KALOS_COLUMNS if c in row.columns)
        job_id = row.text("job_id")
        tenant = row.text("user")
        optional_count(row, "node_num")
        gpus = row.non_negative_int("gpu_num")
        optional_count(row, "cpu_num")
        job_type = row.text("type")
        state = row.text("state")
        submit = clock.seconds(row, "submit_time", row.text("submit_time"))
        start = clock.cell(row, "start_time")
        end = clock.cell(row, "end_time")
        duration = optional_amount(row, "duration")
        optional_amount(row, "queue")
        optional_amount(row, "gpu_time")
        for column in extra:
            clock.cell(row, column)
        ran = recorded_run(row, gpus, start, end, duration)
        if isinstance(ran, str):
            yield ran
            continue
        iterations, iteration_time = unit_iterations(ran)
        yield Candidate(row, submit, state, {
            "job_id": job_id, "tenant": tenant, "model": "unknown", "job_type": job_type,
            "gpus": gpus, "iterations": iterations, "iteration_time_s": iteration_time,
            "duration_s": ran}, _FIELDS,
            fail_at=failure_marks((), state == FAILED, ran, iterations))


FORMAT = StreamFormat(
    name="acme",
    default_overhead="flat:30",
    scan=scan,
    assumptions=ASSUMPTIONS,
    failures=FAILURES,
    required=COLUMNS,
    optional=KALOS_COLUMNS,
)
