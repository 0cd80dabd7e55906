"""Builders that write production-trace files in exactly their published layouts.

Nothing is downloaded: each builder writes the upstream columns (same names, same order,
headerless where upstream is) around one realistic default record, and tests override single
cells or keys to build the case they need. Data rows of a CSV start on line 2 (line 1 with
PAI's headerless tables); Philly's job log is written one job per line after the opening
`[`, so job i starts on line i + 2.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from traces.readers import acme, helios, pai, philly_log

HELIOS_ROW = {
    "job_id": "2fHlgq", "user": "uR7V0", "vc": "vc6YE", "gpu_num": "8", "cpu_num": "48",
    "node_num": "1", "state": "COMPLETED", "submit_time": "2020-04-01 00:00:23",
    "start_time": "2020-04-01 00:00:24", "end_time": "2020-04-01 01:00:24",
    "duration": "3600", "queue": "1",
}  # fmt: skip
ACME_ROW = {
    "job_id": "dlc1q9xk2w", "user": "u0142", "node_num": "1", "gpu_num": "8", "cpu_num": "64",
    "type": "SFT", "state": "COMPLETED", "submit_time": "2023-07-01 00:00:00",
    "start_time": "2023-07-01 00:00:10", "end_time": "2023-07-01 02:00:10",
    "duration": "7200", "queue": "10", "gpu_time": "57600",
}  # fmt: skip
KALOS_EXTRA = {"fail_time": "", "stop_time": ""}
PHILLY_JOB: dict[str, Any] = {
    "status": "Pass",
    "vc": "ee9e8c",
    "jobid": "application_1506638472019_10238",
    "attempts": [{
        "start_time": "2017-10-03 06:39:26",
        "end_time": "2017-10-03 07:39:26",
        "detail": [{"ip": "m12", "gpus": ["gpu0", "gpu1"]}],
    }],
    "submitted_time": "2017-10-03 06:39:19",
    "user": "6c2c1f",
}
PAI_JOB = {
    "job_name": "4b3f7a0c55bd2a1f0e9c6d8e", "inst_id": "8d2c1e7a3f", "user": "58540f191766",
    "status": "Terminated", "start_time": "5437240.0", "end_time": "5440800.0",
}  # fmt: skip
PAI_TASK = {
    "job_name": "4b3f7a0c55bd2a1f0e9c6d8e", "task_name": "worker", "inst_num": "2.0",
    "status": "Terminated", "start_time": "5437300.0", "end_time": "5440700.0",
    "plan_cpu": "600.0", "plan_mem": "29.296875", "plan_gpu": "100.0", "gpu_type": "V100",
}  # fmt: skip
PAI_MACHINE = {"machine": "8e9d7a1b2c", "gpu_type": "V100", "cap_cpu": "96", "cap_mem": "512",
               "cap_gpu": "8"}


def _csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, str]],
         header: bool = True, newline: str = "\n") -> Path:
    lines = [",".join(columns)] if header else []
    lines += [",".join(row[c] for c in columns) for row in rows]
    path.write_bytes((newline.join(lines) + newline).encode())
    return path


def helios_rows(rows: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """Default Helios rows with overrides; ids default to j0, j1, ..."""
    return [{**HELIOS_ROW, "job_id": f"j{i}", **r} for i, r in enumerate(rows)]


def write_helios(directory: Path, rows: Sequence[Mapping[str, str]], *,
                 name: str = "cluster_log.csv", columns: Sequence[str] = helios.COLUMNS,
                 newline: str = "\n") -> Path:
    filled = [{"jobname": "hashed", **r} for r in helios_rows(rows)]
    return _csv(directory / name, columns, filled, newline=newline)


def write_gpu_numbers(directory: Path, days: Sequence[tuple[str, Mapping[str, str]]],
                      vcs: Sequence[str]) -> Path:
    rows = [{"date": day, **{vc: counts.get(vc, "") for vc in vcs}} for day, counts in days]
    return _csv(directory / "cluster_gpu_number.csv", ["date", *vcs], rows)


def write_acme(directory: Path, rows: Sequence[Mapping[str, str]], *, kalos: bool = False,
               name: str | None = None) -> Path:
    columns = (*acme.COLUMNS, *acme.KALOS_COLUMNS) if kalos else acme.COLUMNS
    filled = [{**ACME_ROW, **KALOS_EXTRA, "job_id": f"dlc{i}", **r} for i, r in enumerate(rows)]
    default = "trace_kalos.csv" if kalos else "trace_seren.csv"
    return _csv(directory / (name or default), columns, filled)


DELETE: Any = object()


def philly_job(i: int = 0, **overrides: Any) -> dict[str, Any]:
    """Philly job number i (its jobid ends in i); keys in `overrides` replace the default's,
    DELETE removes one."""
    job = {**json.loads(json.dumps(PHILLY_JOB)), "jobid": f"application_1506638472019_{i}",
           **overrides}
    return {k: v for k, v in job.items() if v is not DELETE}


def attempt(start: str | None, end: str | None, gpus: int = 2, machines: int = 1
            ) -> dict[str, Any]:
    per = gpus // machines
    return {"start_time": start, "end_time": end,
            "detail": [{"ip": f"m{k}", "gpus": [f"gpu{g}" for g in range(per)]}
                       for k in range(machines)] if gpus else []}


def write_philly_log(directory: Path, jobs: Sequence[Mapping[str, Any]], *,
                     name: str = philly_log.JOB_LOG, indent: int | None = None) -> Path:
    """Job i starts on line i + 2 (one job per line) unless `indent` pretty-prints them."""
    if indent is None:
        text = "[\n" + ",\n".join(json.dumps(j) for j in jobs) + "\n]\n"
    else:
        text = json.dumps(list(jobs), indent=indent) + "\n"
    path = directory / name
    path.write_text(text)
    return path


def philly_jobs(count: int, **overrides: Any) -> list[dict[str, Any]]:
    return [philly_job(i, **overrides) for i in range(count)]


def write_machine_list(directory: Path, machines: Sequence[tuple[str, str, str]]) -> Path:
    rows = [dict(zip(philly_log.MACHINE_COLUMNS, m, strict=True)) for m in machines]
    return _csv(directory / philly_log.MACHINE_LIST, philly_log.MACHINE_COLUMNS, rows)


def write_pai(directory: Path, jobs: Sequence[Mapping[str, str]],
              tasks: Sequence[Mapping[str, str]], *, header: bool = False) -> Path:
    """PAI's job and task tables (headerless, as published) in `directory`; returns it.

    Jobs default to names job0, job1, ...; tasks to job0's worker unless they say."""
    job_rows = [{**PAI_JOB, "job_name": f"job{i}", **j} for i, j in enumerate(jobs)]
    task_rows = [{**PAI_TASK, "job_name": "job0", **t} for t in tasks]
    _csv(directory / pai.JOB_TABLE, pai.JOB_COLUMNS, job_rows, header=header)
    _csv(directory / pai.TASK_TABLE, pai.TASK_COLUMNS, task_rows, header=header)
    return directory


def write_pai_machines(directory: Path, machines: Sequence[Mapping[str, str]],
                       header: bool = False) -> Path:
    rows = [{**PAI_MACHINE, "machine": f"m{i}", **m} for i, m in enumerate(machines)]
    return _csv(directory / pai.MACHINE_SPEC, pai.MACHINE_COLUMNS, rows, header=header)
