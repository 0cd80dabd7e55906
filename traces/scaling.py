"""Elastic scaling profiles: ElasticFlow's throughput tables, one per GPU type.

`throughputs_<TYPE>/<model>.csv` has a header `global_batch_size,1,2,4,…,64` and one row per
global batch size; a cell is the iterations per second of the whole job at that GPU count,
`nan` or empty where the artifact could not run it. `with_scaling` gives a deadline trace's jobs
their profile, as ElasticFlow's simulator reads them: progress at any GPU count comes from the
table, and the largest usable count is the table's largest (≤ 64, ≤ the batch size).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from schemas.job import JobSpec
from traces.bundled import DATA_DIR
from traces.errors import TraceError

GPU_TYPES = ("A100", "T4")
MAX_LEVEL = 64

Curve = dict[int, float]  # GPU count → iterations/s of the whole job


@dataclass(frozen=True)
class ScalingTable:
    gpu_type: str
    curves: dict[str, dict[int, Curve]]  # model → global batch size → curve

    def curve(self, model: str, batch_size: int) -> Curve | None:
        return self.curves.get(model, {}).get(batch_size)


@cache
def load_scaling(gpu_type: str) -> ScalingTable:
    """The bundled table for `gpu_type` (A100 or T4)."""
    if gpu_type not in GPU_TYPES:
        raise ValueError(f"--gpu-type {gpu_type!r}: known types are {', '.join(GPU_TYPES)}")
    return read_folder(DATA_DIR / "elasticflow" / f"throughputs_{gpu_type}", gpu_type)


def read_folder(folder: Path, name: str) -> ScalingTable:
    """Every `<model>.csv` of `folder` (a bundled table, or `loom profile`'s measured one)."""
    return ScalingTable(name, {p.stem: _read(p) for p in sorted(folder.glob("*.csv"))})


def _read(path: Path) -> dict[int, Curve]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][0] != "global_batch_size":
        raise TraceError(path, 1, None, "expected a header starting with global_batch_size")
    try:
        counts = [int(c) for c in rows[0][1:]]
    except ValueError:
        raise TraceError(path, 1, None, "GPU-count columns must be integers") from None
    out: dict[int, Curve] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        try:
            batch = int(row[0])
            cells = [float(c) if c.strip() else math.nan for c in row[1:]]
        except ValueError as exc:
            raise TraceError(path, line, None, f"not a number: {exc}") from None
        out[batch] = {g: v for g, v in zip(counts, cells, strict=False)
                      if math.isfinite(v) and v > 0}
    return out


def with_scaling(jobs: Iterable[JobSpec], table: ScalingTable) -> tuple[JobSpec, ...]:
    """Jobs made elastic from the table; jobs whose model/batch size it lacks stay as they are
    (a trace may mix profiled and unprofiled models)."""
    out = []
    for job in jobs:
        curve = table.curve(job.model, job.batch_size or 0)
        if not curve:
            out.append(job)
            continue
        top = min(max(curve), MAX_LEVEL, job.batch_size or MAX_LEVEL)
        levels = {g: r for g, r in curve.items() if g <= top}
        if not levels:
            out.append(job)
            continue
        at_request = levels.get(job.gpus)
        out.append(job.model_copy(update={
            "scaling": levels,
            "min_gpus": 1,
            "max_gpus": max(max(levels), job.gpus),
            "iteration_time_s": 1.0 / at_request if at_request else job.iteration_time_s,
        }))
    return tuple(out)
