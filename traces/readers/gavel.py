"""Gavel (OSDI'20) traces: headerless, tab-separated, one job per line; times in seconds.

Two layouts, told apart by the number of fields:

* `gavel` (10 fields, what Gavel's `utils.parse_trace` reads and `Job.__str__` writes):
  job_type, command, working_directory, num_steps_arg, needs_data_dir, total_steps,
  scale_factor, priority_weight, SLO (-1 = none), arrival_time.
* `gavel-msr` (7 fields, the Philly-derived `traces/msr/seed=*/` files): job_type, command,
  num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor.

A trace records steps, not time: speed comes from a throughput profile (iterations/s of each job
type at each GPU count on each GPU type). The 10-field layout is looked up at its own GPU count,
as Gavel's simulator does. The msr files were written by a 2019 Gavel whose profiles were keyed
by job type alone, so their steps and speeds are the 1-GPU ones whatever the GPU count (about a
tenth of their jobs use GPU counts nobody profiled, 16 or 32 GPUs, or 4 GPUs of CycleGAN).

Jobs are numbered by row ("0", "1", ...) as Gavel numbers them, so per-job results compare.
Gavel times a job on its reference GPU type, the V100: `iteration_time_s` is 1 / that rate, and
an SLO s gives the deadline arrival + s x (steps / V100 rate).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from traces.errors import TraceError
from traces.readers._csv import Parsed, Row, Table, make_job
from traces.throughputs import ThroughputTable

FIELDS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time",
)
MSR_FIELDS = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time",
    "scale_factor",
)
REFERENCE_TYPE = "v100"

_BATCH = re.compile(r"^(.*) \(batch size (\d+)\)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:\-/]+")  # outside JobSpec's Name pattern

_COLUMNS = {
    "job_type": "job_type",
    "model": "job_type",
    "batch_size": "job_type",
    "throughputs": "job_type",
    "iteration_time_s": "job_type",
    "gpus": "scale_factor",
    "iterations": "total_steps",
    "weight": "priority_weight",
    "deadline_s": "SLO",
    "submit_time_s": "arrival_time",
}


@dataclass(frozen=True)
class GavelFormat:
    name: str
    fields: tuple[str, ...]
    profiled_at_one_gpu: bool  # msr: speeds are the 1-GPU profile (see the module docstring)
    default_overhead: str = "none"  # Gavel's simulator charges nothing for preemption


FORMAT = GavelFormat("gavel", FIELDS, profiled_at_one_gpu=False)
MSR_FORMAT = GavelFormat("gavel-msr", MSR_FIELDS, profiled_at_one_gpu=True)
_BY_WIDTH = {len(f.fields): f for f in (FORMAT, MSR_FORMAT)}


def detect(path: Path) -> GavelFormat | None:
    """The Gavel layout of `path`, judged from its first non-empty line; None if it is not one.

    A tab-separated line of 7 or 10 fields is Gavel's; so is a tab-separated line without
    commas (no CSV header looks like that), which is then reported as having the wrong width.
    Unreadable files are left for the CSV reader to report.
    """
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    return _layout(path, number, line.rstrip("\r\n"))
    except OSError:
        pass
    return None


def _layout(path: Path, number: int, line: str) -> GavelFormat | None:
    if "\t" not in line:
        return None
    width = len(line.split("\t"))
    fmt = _BY_WIDTH.get(width)
    if fmt is None and "," not in line:
        raise TraceError(
            path, number, None,
            f"expected {len(FIELDS)} tab-separated fields (Gavel) or {len(MSR_FIELDS)} "
            f"(legacy msr), got {width}",
        )  # fmt: skip
    return fmt


def read(path: Path, fmt: GavelFormat, throughputs: ThroughputTable) -> Parsed:
    """Every row of a Gavel trace as a JobSpec; arrival times must not decrease."""
    types = tuple(t for t in throughputs.gpu_types if not t.endswith("_unconsolidated"))
    known = set(throughputs.job_types)
    rates: dict[tuple[str, int], dict[str, float]] = {}
    out: Parsed = []
    previous = 0.0
    for index, row in enumerate(_table(path, fmt).rows()):
        job_type = row.text("job_type")
        gpus = row.positive_int("scale_factor")
        iterations = row.positive_int("total_steps")
        arrival = row.non_negative_float("arrival_time")
        row.flag("needs_data_dir")  # checked, unused: the command columns only matter on GPUs
        weight, slo = 1.0, None
        if fmt is FORMAT:
            weight = row.positive_float("priority_weight")
            slo = _slo(row)
        if arrival < previous:
            # Gavel's simulator asserts its arrival list is sorted; it would stop here too.
            raise row.error(
                "arrival_time",
                f"{arrival:g} is earlier than the previous job's {previous:g}; Gavel traces "
                "must be in arrival order",
            )
        previous = arrival
        key = (job_type, 1 if fmt.profiled_at_one_gpu else gpus)
        if key not in rates:
            rates[key] = _rates(row, throughputs, known, types, key)
        speed = rates[key]
        reference = speed.get(REFERENCE_TYPE, 0.0) or max(speed.values())
        model, batch_size = _model(job_type)
        job = make_job(
            row,
            _COLUMNS,
            job_id=str(index),
            job_type=job_type,
            model=model,
            batch_size=batch_size,
            gpus=gpus,
            iterations=iterations,
            iteration_time_s=1.0 / reference,
            throughputs=speed,
            weight=weight,
            submit_time_s=arrival,
            deadline_s=None if slo is None else arrival + slo * iterations / reference,
        )
        out.append((row.line, job))
    return out


def _table(path: Path, fmt: GavelFormat) -> Table:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(path, None, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TraceError(path, None, None, exc.strerror or str(exc)) from None
    records = [
        (number, line.split("\t"))
        for number, line in enumerate(text.split("\n"), start=1)
        if line.strip()
    ]
    return Table(path, fmt.fields, records)


def _slo(row: Row) -> float | None:
    """Gavel's SLO multiple; -1 (any value <= 0) means none."""
    value = row.text("SLO")
    try:
        slo = float(value)
    except ValueError:
        slo = math.nan
    if not math.isfinite(slo):
        raise row.error("SLO", f"expected a number (-1 for none), got {value!r}")
    return slo if slo > 0 else None


def _rates(
    row: Row,
    throughputs: ThroughputTable,
    known: set[str],
    types: tuple[str, ...],
    key: tuple[str, int],
) -> dict[str, float]:
    job_type, gpus = key
    source = throughputs.path.name
    if job_type not in known:
        raise row.error("job_type", f"unknown job type {job_type!r}: not profiled in {source}")
    try:
        speed = throughputs.rates(job_type, gpus, types)
    except KeyError:
        raise row.error(
            "scale_factor", f"{job_type!r} is not profiled at {gpus} GPU(s) in {source}"
        ) from None
    if not any(speed.values()):
        raise row.error("job_type", f"{job_type!r} runs on no GPU type in {source}")
    return speed


def _model(job_type: str) -> tuple[str, int | None]:
    """("ResNet-50", 64) from "ResNet-50 (batch size 64)"; ("A3C", None) from "A3C"."""
    m = _BATCH.match(job_type)
    base, batch = (m.group(1), int(m.group(2))) if m else (job_type, None)
    return _UNSAFE.sub("_", base.strip()), batch
