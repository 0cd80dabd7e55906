"""Builders for trace files in exactly the layouts the real datasets use.

Each dialect has the upstream header (same column order) and one realistic row taken from the
real files; tests override single cells to build the case they need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

MURI_STAGES = ("resource_time_0", "resource_time_1", "resource_time_2")

HEADERS: dict[str, tuple[str, ...]] = {
    "muri": (
        "job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size",
        "duration", "interval", "iteration_time", *MURI_STAGES, "priority",
    ),
    "tiresias": (
        "job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval",
    ),
    "elasticflow": (
        "job_id", "submit_time", "iteration", "model_name", "ddl", "batch_size", "num_gpu",
        "duration",
    ),
    "elasticflow-best-effort": (
        "job_id", "submit_time", "iteration", "model_name", "ddl", "batch_size", "num_gpu",
        "duration", "best_effort",
    ),
    "elasticflow-philly": (
        "job_id", "submit_time", "real_iteration", "model_name", "ddl", "batch_size",
        "num_gpu", "real_duration", "duration", "iteration",
    ),
    "itp": (
        "job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size",
        "num_gpu", "duration",
    ),
    "itp-raw": ("job_id", "submission_time", "duration", "num_gpu"),
    "philly": ("timestamp", "duration", "num_gpus", "gpu_time", "cluster"),
    "cluster": (
        "num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node",
    ),
}  # fmt: skip

_ELASTICFLOW = {
    "job_id": "1",
    "submit_time": "3717550",
    "iteration": "1548",
    "model_name": "ncf",
    "ddl": "3717583",
    "batch_size": "32768",
    "num_gpu": "8",
    "duration": "66",
}

DEFAULTS: dict[str, dict[str, str]] = {
    "muri": {
        "job_id": "1",
        "num_gpu": "8",
        "submit_time": "201694000",
        "iterations": "8787693",
        "model_name": "dqn",
        "batch_size": "128",
        "duration": "4472936000",
        "interval": "201694000",
        "iteration_time": "509",
        "resource_time_0": "435",
        "resource_time_1": "8",
        "resource_time_2": "0.5",
        "priority": "1",
    },
    "tiresias": {
        "job_id": "1",
        "num_gpu": "8",
        "submit_time": "30",
        "iterations": "133",
        "model_name": "vgg11",
        "duration": "147",
        "interval": "23",
    },
    "elasticflow": _ELASTICFLOW,
    "elasticflow-best-effort": {**_ELASTICFLOW, "best_effort": "1"},
    "elasticflow-philly": {
        **_ELASTICFLOW,
        "real_iteration": "26446831",
        "real_duration": "1792395",
    },
    "itp": {
        "job_id": "23b8c1e9-3924-56de-3eb1-3b9046685257",
        "submission_time": "3717550",
        "num_iteration": "48266",
        "model_name": "inception3",
        "deadline": "3720405",
        "batch_size": "64",
        "num_gpu": "8",
        "duration": "3604",
    },
    "itp-raw": {
        "job_id": "5dc7d9cd-c300-9a4f-c3cd-dc2cc0935548",
        "submission_time": "2266647",
        "duration": "604",
        "num_gpu": "16",
    },
    "philly": {
        "timestamp": "2017-10-09 07:01:55",
        "duration": "66.0",
        "num_gpus": "1",
        "gpu_time": "66.0",
        "cluster": "11cb48",
    },
    "cluster": {
        "num_switch": "1",
        "num_node_p_switch": "8",
        "num_gpu_p_node": "8",
        "num_cpu_p_node": "92",
        "mem_p_node": "520",
    },
}

# Line endings as in the published files: Muri and Tiresias use CRLF, the others LF.
NEWLINES = {"muri": "\r\n", "tiresias": "\r\n"}


def csv_text(
    dialect: str,
    rows: Sequence[Mapping[str, str]],
    *,
    columns: Sequence[str] | None = None,
    newline: str | None = None,
) -> str:
    """CSV text for `rows`, each a set of overrides of the dialect's default row.

    Rows without an explicit job_id get their index as id, so ids are unique by default.
    """
    cols = tuple(columns) if columns is not None else HEADERS[dialect]
    eol = newline if newline is not None else NEWLINES.get(dialect, "\n")
    lines = [",".join(cols)]
    for i, overrides in enumerate(rows):
        row = {**DEFAULTS[dialect], **overrides}
        if "job_id" in cols and "job_id" not in overrides:
            row["job_id"] = f"{row['job_id']}-{i}" if dialect.startswith("itp") else str(i)
        lines.append(",".join(row[c] for c in cols))
    return eol.join(lines) + eol


def write_trace(
    directory: Path,
    dialect: str,
    rows: Sequence[Mapping[str, str]],
    *,
    name: str = "trace.csv",
    columns: Sequence[str] | None = None,
    newline: str | None = None,
) -> Path:
    path = directory / name
    path.write_bytes(csv_text(dialect, rows, columns=columns, newline=newline).encode())
    return path
