"""Malformed production-trace records become TraceErrors naming the file, line and field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.traces.production_builders import (
    DELETE,
    attempt,
    philly_job,
    write_acme,
    write_helios,
    write_machine_list,
    write_pai,
    write_pai_machines,
    write_philly_log,
)
from traces import TraceError, load_cluster, load_trace

# (dialect, column, bad value, fragment of the message). The bad cell is in the third data
# row: CSV line 4.
BAD_CELLS: list[tuple[str, str, str, str]] = [
    ("helios", "gpu_num", "x", "expected a non-negative integer, got 'x'"),
    ("helios", "gpu_num", "1.5", "expected a non-negative integer, got '1.5'"),
    ("helios", "gpu_num", "5000", "less than or equal to 4096"),  # JobSpec's bound
    ("helios", "job_id", "", "missing value"),
    ("helios", "job_id", "a b", "should match pattern"),
    ("helios", "vc", "", "missing value"),
    ("helios", "vc", "vc 1", "should match pattern"),  # a tenant is a Name
    ("helios", "user", "", "missing value"),
    ("helios", "state", "", "missing value"),
    ("helios", "submit_time", "", "missing value"),
    ("helios", "submit_time", "yesterday", "expected epoch seconds or a date-time"),
    ("helios", "submit_time", "1585699200", "a file uses one kind"),  # others are date-times
    ("helios", "submit_time", "2020-04-01T00:00:23+08:00", "a file uses one kind"),
    ("helios", "start_time", "soon", "expected epoch seconds or a date-time"),
    ("helios", "end_time", "-5", "expected epoch seconds or a date-time"),
    ("helios", "duration", "-1", "expected a non-negative number, got '-1'"),
    ("helios", "duration", "inf", "expected a non-negative number"),
    ("helios", "duration", "2e12", "less than or equal to"),  # JobSpec's MAX_SECONDS
    ("helios", "queue", "long", "expected a non-negative number"),
    ("helios", "cpu_num", "-4", "expected a non-negative integer"),
    ("helios", "node_num", "one", "expected a non-negative integer"),
    ("acme", "type", "", "missing value"),
    ("acme", "gpu_num", "8 GPUs", "expected a non-negative integer"),
    ("acme", "user", "", "missing value"),
    ("acme", "gpu_time", "-1", "expected a non-negative number"),
    ("acme", "end_time", "later", "expected epoch seconds or a date-time"),
    ("kalos", "fail_time", "never", "expected epoch seconds or a date-time"),
    ("kalos", "stop_time", "1688169600", "a file uses one kind"),
]

_WRITERS: dict[str, Callable[[Path, list[dict[str, str]]], Path]] = {
    "helios": lambda d, rows: write_helios(d, rows),
    "acme": lambda d, rows: write_acme(d, rows),
    "kalos": lambda d, rows: write_acme(d, rows, kalos=True),
}


@pytest.mark.parametrize(("dialect", "column", "value", "fragment"), BAD_CELLS,
                         ids=[f"{d}-{c}-{v!r}" for d, c, v, _ in BAD_CELLS])
def test_bad_cell_names_file_line_and_field(tmp_path: Path, dialect: str, column: str,
                                            value: str, fragment: str) -> None:
    path = _WRITERS[dialect](tmp_path, [{}, {}, {column: value}, {}])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.path, err.line, err.field) == (path, 4, column)
    assert str(err).startswith(f"{path.name} line 4, field '{column}': ")
    assert fragment in err.message


def test_csv_structure_errors(tmp_path: Path) -> None:
    path = write_helios(tmp_path, [{}, {}])
    path.write_text(path.read_text() + "j9,u,vc,8\n")
    with pytest.raises(TraceError, match=r"line 4, field 'cpu_num': expected 12 fields, got 4"):
        load_trace(path)
    path = write_helios(tmp_path, [{}, {"job_id": "j0"}])
    with pytest.raises(TraceError, match=r"line 3, field 'job_id': duplicate job id 'j0' "
                                         r"\(first on line 2\)"):
        load_trace(path)
    path = write_helios(tmp_path, [{"duration": "", "end_time": "2020-04-01 00:00:00"}])
    with pytest.raises(TraceError, match=r"line 2, field 'end_time': is before start_time"):
        load_trace(path)
    path.write_bytes(b"job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,"
                     b"end_time,duration,queue\nj\xff,u,vc,8,1,1,X,1,1,2,1,0\n")
    with pytest.raises(TraceError, match="not UTF-8 text"):
        load_trace(path)


# (case, jobs, line of the error, field, fragment). Job i starts on line i + 2.
PHILLY_BAD: list[tuple[str, list[dict[str, Any]], int, str | None, str]] = [
    ("no vc", [philly_job(0), philly_job(1, vc=DELETE)], 3, "vc", "missing key"),
    ("vc not text", [philly_job(0, vc=7)], 2, "vc", "expected a non-empty string, got 7"),
    ("bad tenant", [philly_job(0, vc="v c")], 2, "vc", "should match pattern"),
    ("bad job id", [philly_job(0, jobid="app/1")], 2, "jobid", "should match pattern"),
    ("no status", [philly_job(0, status=DELETE)], 2, "status", "missing key"),
    ("submit not a time", [philly_job(0, submitted_time="Tuesday")], 2, "submitted_time",
     "expected epoch seconds or a date-time"),
    ("submit a number", [philly_job(0, submitted_time=5)], 2, "submitted_time",
     "expected a date-time or null, got 5"),
    ("attempts not a list", [philly_job(0, attempts={})], 2, "attempts", "expected a list"),
    ("attempt not an object", [philly_job(0, attempts=[3])], 2, "attempts[0]",
     "expected an object, got 3"),
    ("attempt start bad", [philly_job(0, attempts=[attempt("x", None)])], 2,
     "attempts[0].start_time", "expected epoch seconds or a date-time like"),
    ("attempt end missing", [philly_job(0, attempts=[{"start_time": None, "detail": []}])], 2,
     "attempts[0].end_time", "missing key"),
    ("end before start", [philly_job(0, attempts=[
        attempt("2017-10-03 07:00:00", "2017-10-03 06:00:00")])], 2, "attempts[0].end_time",
     "is before its start_time"),
    ("gpus not a list", [philly_job(0, attempts=[
        {"start_time": None, "end_time": None, "detail": [{"ip": "m1", "gpus": 2}]}])], 2,
     "attempts[0].detail[0].gpus", "expected a list"),
    ("gpu names not text", [philly_job(0, attempts=[
        {"start_time": None, "end_time": None, "detail": [{"ip": "m1", "gpus": [0, 1]}]}])], 2,
     "attempts[0].detail[0].gpus", "expected a list of GPU names"),
    ("no ip", [philly_job(0, attempts=[
        {"start_time": None, "end_time": None, "detail": [{"gpus": []}]}])], 2,
     "attempts[0].detail[0].ip", "missing key"),
    ("job not an object", [philly_job(0), ["x"]], 3, "job", "expected an object"),
    ("duplicate id", [philly_job(0), philly_job(1), philly_job(0)], 4, "jobid",
     "duplicate job id 'application_1506638472019_0' (first on line 2)"),
]


@pytest.mark.parametrize(("jobs", "line", "field", "fragment"),
                         [c[1:] for c in PHILLY_BAD], ids=[c[0] for c in PHILLY_BAD])
def test_philly_log_errors_name_the_job_line_and_key(
        tmp_path: Path, jobs: list[dict[str, Any]], line: int, field: str | None,
        fragment: str) -> None:
    path = write_philly_log(tmp_path, jobs)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.path, info.value.line, info.value.field) == (path, line, field)
    assert fragment in info.value.message


def test_philly_log_on_one_line_names_the_item(tmp_path: Path) -> None:
    path = tmp_path / "cluster_job_log"
    path.write_text(json.dumps([philly_job(0), philly_job(1), philly_job(2, vc="")]))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == ("cluster_job_log line 1, field 'vc': expected a non-empty "
                               "string, got '' (item 3 of the list)")


_JOB = json.dumps(philly_job(0))
_JOB2 = json.dumps(philly_job(1))


@pytest.mark.parametrize(("text", "line", "fragment"), [
    ('[\n{"jobid": "a",\n "vc": }\n]\n', 3, "invalid JSON"),
    (f"[\n{_JOB}\n{_JOB2}\n]", 3, "expected ',' or ']' between jobs"),
    (f"[\n{_JOB},\n]\n", 3, "expected a job after ','"),
    (f"[\n{_JOB}\n", 3, "the JSON list is not closed"),
    ("[]\n]", 2, "unexpected text after the JSON list"),
    ('{"jobs": []}', 1, "expected a JSON list of jobs"),
], ids=["bad value", "no comma", "trailing comma", "unclosed", "trailing text", "not a list"])
def test_philly_log_json_errors(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = tmp_path / "cluster_job_log"
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == line and fragment in info.value.message


# (case, table, row overrides, field, fragment). The bad row is the table's second (line 2:
# the tables have no header).
PAI_BAD: list[tuple[str, str, dict[str, str], str | None, str]] = [
    ("plan_gpu", "task", {"plan_gpu": "lots"}, "plan_gpu", "expected a non-negative number"),
    ("inst_num", "task", {"inst_num": "0"}, "inst_num", "expected a positive integer"),
    ("task start", "task", {"start_time": "t0"}, "start_time", "expected epoch seconds"),
    ("task end first", "task", {"end_time": "5437000"}, "end_time", "is before start_time"),
    ("task name", "task", {"task_name": ""}, "task_name", "missing value"),
    ("too many GPUs", "task", {"plan_gpu": "800", "inst_num": "600"}, "plan_gpu",
     "less than or equal to 4096"),
    ("submission", "job", {"start_time": ""}, "start_time", "missing value"),
    ("user", "job", {"user": "a b"}, "user", "should match pattern"),
    ("job twice", "job", {"job_name": "job0"}, "job_name", "appears twice in the job table"),
]


@pytest.mark.parametrize(("table", "overrides", "field", "fragment"),
                         [c[1:] for c in PAI_BAD], ids=[c[0] for c in PAI_BAD])
def test_pai_errors_name_the_table_line_and_field(
        tmp_path: Path, table: str, overrides: dict[str, str], field: str | None,
        fragment: str) -> None:
    jobs: list[dict[str, str]] = [{}, {}]
    tasks: list[dict[str, str]] = [{}, {"task_name": "worker2"}]
    (jobs if table == "job" else tasks)[1].update(overrides)
    write_pai(tmp_path, jobs, tasks)
    with pytest.raises(TraceError) as info:
        load_trace(str(tmp_path))
    assert info.value.path.name == f"pai_{table}_table.csv"
    assert (info.value.line, info.value.field) == (2, field)
    assert fragment in info.value.message


def test_pai_table_without_its_partner(tmp_path: Path) -> None:
    write_pai(tmp_path, [{}], [{}])
    (tmp_path / "pai_task_table.csv").unlink()
    with pytest.raises(TraceError, match="the task table must sit beside it"):
        load_trace(tmp_path / "pai_job_table.csv")
    with pytest.raises(TraceError, match="holds an Alibaba PAI table but no pai_task_table"):
        load_trace(str(tmp_path))


def test_folder_with_no_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="is a directory, not a trace file"):
        load_trace(str(tmp_path))
    with pytest.raises(TraceError, match="is a folder with no trace Loom reads"):
        load_trace(tmp_path)  # a Path is taken as given


def test_folder_files_agree_with_the_readers() -> None:
    from traces.bundled import TRACE_FOLDER_FILES
    from traces.readers import helios, pai, philly_log

    assert set(TRACE_FOLDER_FILES) == {philly_log.JOB_LOG, helios.LOG, pai.JOB_TABLE,
                                       pai.TASK_TABLE}


def test_unknown_header_lists_the_production_formats(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    for name in ("philly-log", "helios (job_id, user, vc", "acme (", "alibaba-pai"):
        assert name in info.value.message


# (case, writer, line, field, fragment) for the machine tables.
MACHINE_BAD: list[tuple[str, Callable[[Path], Path], int, str | None, str]] = [
    ("philly GPUs", lambda d: write_machine_list(d, [("m1", "8", "24GB"), ("m2", "x", "24GB")]),
     3, "number of GPUs", "expected a non-negative integer"),
    ("philly memory", lambda d: write_machine_list(d, [("m1", "8", "lots")]),
     2, "single GPU mem", "expected a size such as 24GB"),
    ("philly twice", lambda d: write_machine_list(d, [("m1", "8", "24GB"), ("m1", "2", "12")]),
     3, "machineId", "listed twice (first on line 2)"),
    ("philly id", lambda d: write_machine_list(d, [("m.1", "8", "24GB")]),
     2, "machineId", "should match pattern"),
    ("pai GPUs", lambda d: write_pai_machines(d, [{}, {"cap_gpu": "two"}]),
     2, "cap_gpu", "expected a non-negative integer"),
    ("pai node size", lambda d: write_pai_machines(d, [{"cap_gpu": "80"}]),
     1, "cap_gpu", "less than or equal to 64"),
]


@pytest.mark.parametrize(("write", "line", "field", "fragment"),
                         [c[1:] for c in MACHINE_BAD], ids=[c[0] for c in MACHINE_BAD])
def test_machine_table_errors(tmp_path: Path, write: Callable[[Path], Path], line: int,
                              field: str | None, fragment: str) -> None:
    path = write(tmp_path)
    with pytest.raises(TraceError) as info:
        load_cluster(str(path))
    assert (info.value.line, info.value.field) == (line, field)
    assert fragment in info.value.message
