"""`load_trace`: read a trace file in any known format into JobSpecs."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from schemas.job import JobSpec
from traces.bundled import resolve_trace
from traces.errors import TraceError
from traces.readers import Parsed, detect, gavel, read_table
from traces.throughputs import ThroughputTable, load_throughputs


@dataclass(frozen=True)
class Trace:
    """A loaded trace.

    `jobs` are sorted by submission time, ties kept in file order. `default_overhead` names
    the preemption/restart overhead model of the system the trace comes from ("muri", "none",
    "elasticflow", "flat:30"), for simulators that want to reproduce it. `profile` is the
    throughput table the job speeds came from (Gavel traces), which also gives co-located
    speeds for space sharing.
    """

    name: str
    path: Path
    format: str
    jobs: tuple[JobSpec, ...]
    default_overhead: str
    profile: ThroughputTable | None = None


def load_trace(name_or_path: str | Path, *, throughputs: ThroughputTable | None = None) -> Trace:
    """Load a bundled trace (e.g. "muri/trace1", see `bundled_traces()`), a CSV file or a
    Gavel trace (tab-separated, no header).

    The format is recognised from the content, not the file name. Gavel traces get their
    speeds from `throughputs` (default: Gavel's simulation profile); other formats ignore it.
    Raises TraceError (with file, line and column) for an unknown name or header, a malformed
    row or a duplicate job id.
    """
    name, path = resolve_trace(name_or_path)
    layout = gavel.detect(path)
    if layout is not None:
        profile = throughputs if throughputs is not None else _default_throughputs()
        parsed = gavel.read(path, layout, profile)
        fmt_name, overhead = layout.name, layout.default_overhead
    else:
        profile = None
        csv_table = read_table(path)
        fmt = detect(csv_table)
        parsed = fmt.read(csv_table)
        fmt_name, overhead = fmt.name, fmt.default_overhead
    _check_unique_ids(path, parsed)
    parsed.sort(key=lambda item: item[1].submit_time_s)  # list.sort is stable
    return Trace(
        name=name,
        path=path,
        format=fmt_name,
        jobs=tuple(job for _, job in parsed),
        default_overhead=overhead,
        profile=profile,
    )


@functools.cache
def _default_throughputs() -> ThroughputTable:
    # Parsing the 1.2 MB profile takes about half a second; every Gavel trace shares it.
    return load_throughputs()


def _check_unique_ids(path: Path, parsed: Parsed) -> None:
    first_line: dict[str, int] = {}
    for line, job in parsed:
        seen = first_line.setdefault(job.job_id, line)
        if seen != line:
            raise TraceError(
                path, line, "job_id", f"duplicate job id {job.job_id!r} (first on line {seen})"
            )
