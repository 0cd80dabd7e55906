"""The production-trace readers: each published layout becomes JobSpecs, streamed, with the
jobs that never ran counted by reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.traces.production_builders import (
    DELETE,
    attempt,
    philly_job,
    philly_jobs,
    write_acme,
    write_helios,
    write_pai,
    write_philly_log,
)
from traces import load_trace
from traces.readers import _stream, helios


def _fields(job: Any, expected: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(job, k) for k in expected}


def test_helios_row_becomes_a_duration_job_of_its_vc(tmp_path: Path) -> None:
    trace = load_trace(write_helios(tmp_path, [{}, {"submit_time": "2020-04-01 00:10:23",
                                                    "duration": "90.5", "gpu_num": "16"}]))
    assert (trace.format, trace.default_overhead, trace.name) == ("helios", "flat:30",
                                                                  "cluster_log")
    assert trace.job_count == 2 and trace.skipped == {} and trace.filtered_out == 0
    assert any("duration-only" in a for a in trace.assumptions)
    first, second = trace.jobs
    expected = {"job_id": "j0", "tenant": "vc6YE", "gpus": 8, "model": "unknown",
                "submit_time_s": 0.0, "duration_s": 3600.0, "iterations": 3600,
                "iteration_time_s": 1.0, "job_type": None, "gpu_type": None}
    assert _fields(first, expected) == expected
    assert (second.submit_time_s, second.gpus, second.duration_s) == (600.0, 16, 90.5)
    assert second.iterations * second.iteration_time_s == pytest.approx(90.5)
    assert list(trace.iter_jobs()) == list(trace.jobs)  # built again, equal


@pytest.mark.parametrize(("times", "offset"), [
    (("2020-04-01 00:00:00", "2020-04-01 00:01:40"), 100.0),
    (("1585699200", "1585699300"), 100.0),  # epoch seconds
    (("2020-04-01T08:00:00+08:00", "2020-04-01T00:01:40+00:00"), 100.0),  # zones honoured
], ids=["date-times", "epoch", "zoned"])
def test_helios_times_are_date_times_or_epoch_seconds(
        tmp_path: Path, times: tuple[str, str], offset: float) -> None:
    rows = [{"submit_time": t, "start_time": t, "end_time": ""} for t in times]
    trace = load_trace(write_helios(tmp_path, rows))
    assert [j.submit_time_s for j in trace.jobs] == [0.0, offset]


def test_helios_jobs_that_never_ran_are_counted_by_reason(tmp_path: Path) -> None:
    rows = [
        {},
        {"gpu_num": "0"},  # a CPU job
        {"gpu_num": "0", "start_time": "", "end_time": "", "duration": ""},
        {"state": "CANCELLED", "start_time": "", "end_time": "", "duration": "", "queue": ""},
        {"state": "RUNNING", "end_time": "", "duration": ""},
        {"duration": "0", "end_time": "2020-04-01 00:00:24"},
        {"duration": "", "end_time": "2020-04-01 00:00:24"},  # zero from end - start
        {"duration": ""},  # end - start = 3600
    ]
    trace = load_trace(write_helios(tmp_path, rows))
    assert [j.job_id for j in trace.jobs] == ["j0", "j7"]
    assert trace.jobs[1].duration_s == 3600.0
    assert dict(trace.skipped) == {"no GPUs": 2, "never started": 1, "zero duration": 2,
                                   "still running (no end time)": 1}


def test_out_of_order_files_come_out_in_submission_order(tmp_path: Path) -> None:
    # Sorted by end time, as a scheduler's accounting dump is: submissions out of order.
    stamps = ["00:05", "00:01", "00:03", "00:01", "00:00", "00:09", "00:02"]
    rows = [{"submit_time": f"2020-04-01 00:{s}", "start_time": f"2020-04-01 00:{s}"}
            for s in stamps]
    trace = load_trace(write_helios(tmp_path, rows))
    order = ["j4", "j1", "j3", "j6", "j2", "j0", "j5"]  # ties (j1, j3) in file order
    assert [j.job_id for j in trace.iter_jobs()] == order
    assert [j.job_id for j in trace.jobs] == order


def test_helios_folder_crlf_and_jobname_column(tmp_path: Path) -> None:
    write_helios(tmp_path, [{}, {}], columns=("job_id", "jobname", *helios.COLUMNS[1:]),
                 newline="\r\n")
    trace = load_trace(str(tmp_path))  # the cluster's folder
    assert trace.format == "helios" and trace.job_count == 2


@pytest.mark.parametrize("kalos", [False, True], ids=["seren", "kalos"])
def test_acme_keeps_the_job_type_and_the_user_as_tenant(tmp_path: Path, kalos: bool) -> None:
    extra = {"fail_time": "2023-07-01 00:30:10"} if kalos else {}
    rows = [{"type": "Pretrain", "gpu_num": "1024", "node_num": "128"},
            {"type": "Eval", "state": "FAILED", "duration": "1800", **extra},
            {"type": "Debug", "gpu_num": "0"}]
    trace = load_trace(write_acme(tmp_path, rows, kalos=kalos))
    assert trace.format == "acme" and dict(trace.skipped) == {"no GPUs": 1}
    assert [(j.job_id, j.job_type, j.tenant, j.gpus, j.duration_s) for j in trace.jobs] == [
        ("dlc0", "Pretrain", "u0142", 1024, 7200.0), ("dlc1", "Eval", "u0142", 8, 1800.0)]
    failed = load_trace(trace.path, trace_filter="state=failed")
    assert [j.job_id for j in failed.jobs] == ["dlc1"]


def test_philly_log_gpus_duration_restarts_and_tenant(tmp_path: Path) -> None:
    jobs = [
        philly_job(0),
        # Two attempts: the first lists no GPUs (a scheduling failure), the second 8 GPUs on
        # two machines; it ran 10 + 20 minutes and restarted once.
        philly_job(1, vc="6214e9", status="Failed", submitted_time="2017-10-03 06:40:19",
                   attempts=[attempt("2017-10-03 06:41:00", "2017-10-03 06:51:00", gpus=0),
                             attempt("2017-10-03 07:00:00", "2017-10-03 07:20:00", gpus=8,
                                     machines=2)]),
    ]
    trace = load_trace(write_philly_log(tmp_path, jobs))
    assert (trace.format, trace.restarts, dict(trace.skipped)) == ("philly-log", 1, {})
    first, second = trace.jobs
    assert (first.job_id, first.tenant, first.gpus, first.submit_time_s, first.duration_s) == (
        "application_1506638472019_0", "ee9e8c", 2, 0.0, 3600.0)
    assert (second.tenant, second.gpus, second.submit_time_s, second.duration_s) == (
        "6214e9", 8, 60.0, 1800.0)


def test_philly_log_jobs_that_never_ran(tmp_path: Path) -> None:
    jobs = [
        philly_job(0),
        philly_job(1, submitted_time=None),
        philly_job(2, attempts=[]),  # killed while queued
        philly_job(3, attempts=[attempt(None, None)]),
        philly_job(4, attempts=[attempt("2017-10-03 07:00:00", None)]),  # still running
        philly_job(5, attempts=[attempt("2017-10-03 07:00:00", "2017-10-03 07:00:00")]),
        philly_job(6, attempts=[attempt("2017-10-03 07:00:00", "2017-10-03 07:10:00", gpus=0)]),
    ]
    trace = load_trace(write_philly_log(tmp_path, jobs))
    assert trace.job_count == 1
    assert dict(trace.skipped) == {"no submitted_time": 1, "never started": 2, "no GPUs": 1,
                                   "still running (no end time)": 1, "zero duration": 1}


def test_philly_log_is_streamed_across_chunks(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = philly_jobs(40, user="a" * 50)
    jobs[7] = philly_job(7, user=DELETE)  # forbidden: reported with its line
    whole = write_philly_log(tmp_path, jobs[:7] + jobs[8:], indent=4)
    expected = [j.job_id for j in load_trace(whole).jobs]
    monkeypatch.setattr(_stream, "_CHUNK", 64)  # every job spans several reads
    assert [j.job_id for j in load_trace(whole).jobs] == expected
    assert len(expected) == 39
    folder = tmp_path / "trace-data"
    folder.mkdir()
    write_philly_log(folder, jobs)
    with pytest.raises(Exception, match=r"cluster_job_log line 9, field 'user': missing key"):
        load_trace(str(folder))


def test_pai_joins_job_and_task_tables_whole_gpus_only(tmp_path: Path) -> None:
    write_pai(tmp_path, jobs=[{}, {"user": "a1b2c3", "start_time": "5437000.0"}], tasks=[
        {"task_name": "ps", "plan_gpu": "", "gpu_type": ""},  # parameter server: no GPUs
        {},  # 2 instances of 1 GPU
        {"job_name": "job1", "task_name": "PyTorchWorker", "inst_num": "1",
         "plan_gpu": "800.0", "gpu_type": "V100M32", "status": "Failed"},
        {"job_name": "job1", "task_name": "evaluator", "plan_gpu": "50.0"},  # fractional
        {"job_name": "job9", "task_name": "worker"},  # no such job
        {"task_name": "tensorflow", "start_time": "", "end_time": "", "status": "Waiting"},
    ])
    for where in (tmp_path, tmp_path / "pai_job_table.csv", tmp_path / "pai_task_table.csv"):
        trace = load_trace(str(where))
        assert trace.format == "alibaba-pai"
        assert [(j.job_id, j.tenant, j.gpus, j.gpu_type, j.submit_time_s, j.duration_s)
                for j in trace.jobs] == [
            ("job1.PyTorchWorker", "a1b2c3", 8, "V100M32", 0.0, 3400.0),
            ("job0.worker", "58540f191766", 2, "V100", 240.0, 3400.0)]
        assert dict(trace.skipped) == {
            "no GPUs": 1, "fractional GPU request (plan_gpu not a multiple of 100)": 1,
            "task of a job missing from the job table": 1, "never started": 1}


def test_pai_tables_with_their_header_row(tmp_path: Path) -> None:
    write_pai(tmp_path, jobs=[{}], tasks=[{}], header=True)
    assert load_trace(str(tmp_path)).job_count == 1


def test_research_traces_report_nothing_left_out() -> None:
    trace = load_trace("tiresias/60_job")
    assert (trace.skipped, trace.filtered_out, trace.restarts, trace.assumptions) == (
        {}, 0, 0, ())
    assert trace.job_count == 60 and list(trace.iter_jobs()) == list(trace.jobs)
