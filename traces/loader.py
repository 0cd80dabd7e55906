"""`load_trace`: read a trace file in any known format into JobSpecs."""

from __future__ import annotations

import functools
import operator
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import compress, islice
from pathlib import Path

from schemas.job import JobSpec
from traces.bundled import resolve_trace
from traces.errors import TraceError
from traces.filters import TraceFilter, parse_filter
from traces.readers import Parsed, detect, gavel, locate, read_table
from traces.readers._csv import validated
from traces.readers._stream import Candidate, StreamFormat
from traces.throughputs import ThroughputTable, load_throughputs


class JobStream:
    """The jobs of a streamed (production) trace, built from the file each time they are
    iterated, so no more than a few are alive at once.

    `keep` marks, per job that ran (in file order), whether the filter keeps it (None: all);
    `rank` gives each one's place in submission order when the file is not in that order
    (None: it is). Out-of-order jobs wait in a buffer until their turn, so a file sorted by
    another key costs memory in proportion to how far its jobs are out of place.
    """

    def __init__(self, fmt: StreamFormat, path: Path, origin: float, shift: float, count: int,
                 candidates: int, keep: bytearray | None, rank: array[int] | None,
                 replay_failures: bool = False) -> None:
        self.fmt = fmt
        self.path = path
        self.origin = origin
        self.shift = shift
        self.count = count
        self.candidates = candidates
        self.keep = keep
        self.rank = rank
        self.replay_failures = replay_failures

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[JobSpec]:
        keep, rank, origin, shift = self.keep, self.rank, self.origin, self.shift
        waiting: dict[int, JobSpec] = {}
        want = 0
        k = -1
        for item in self.fmt.scan(self.path):
            if isinstance(item, str):
                continue
            k += 1
            if k >= self.candidates or (keep is not None and not keep[k]):
                continue
            job = _build(item, max(0.0, item.submit - origin - shift), self.replay_failures)
            if rank is None:
                yield job
                continue
            if rank[k] != want:
                waiting[rank[k]] = job
                continue
            yield job
            want += 1
            while want in waiting:
                yield waiting.pop(want)
                want += 1
        if k + 1 != self.candidates or waiting:
            raise TraceError(self.path, None, None,
                             "the file changed while it was read; load the trace again")


@dataclass(frozen=True, eq=False)
class Trace:
    """A loaded trace.

    `jobs` are sorted by submission time, ties kept in file order. `default_overhead` names
    the preemption/restart overhead model of the system the trace comes from ("muri", "none",
    "elasticflow", "flat:30"), for simulators that want to reproduce it. `profile` is the
    throughput table the job speeds came from (Gavel traces), which also gives co-located
    speeds for space sharing.

    A production trace (Philly's job log, Helios, Acme, Alibaba PAI) is streamed: loading
    reads and checks the whole file but keeps no JobSpec; `iter_jobs()` reads it again and
    yields them one at a time, in order, while `jobs` builds them all (about 1.7 kB each).
    Its recorded jobs that never ran are counted in `skipped` (reason -> count), those the
    filter left out in `filtered_out`, the restarts of the kept jobs in `restarts` (Philly),
    and `assumptions` says how recorded jobs became simulated ones, for reports. With
    `replay_failures` its jobs carry the failures it records (`JobSpec.fail_at`), `failures`
    of them among the kept jobs (counted either way).
    """

    name: str
    path: Path
    format: str
    source: tuple[JobSpec, ...] | JobStream
    default_overhead: str
    profile: ThroughputTable | None = None
    skipped: Mapping[str, int] = field(default_factory=dict)
    filtered_out: int = 0
    restarts: int = 0
    assumptions: tuple[str, ...] = ()
    trace_filter: TraceFilter | None = None
    replay_failures: bool = False
    failures: int = 0

    @property
    def job_count(self) -> int:
        """How many jobs the trace has, without building them."""
        return len(self.source)

    def iter_jobs(self) -> Iterator[JobSpec]:
        """The jobs in submission order; a streamed trace reads its file again for them."""
        return iter(self.source)

    @functools.cached_property
    def jobs(self) -> tuple[JobSpec, ...]:
        return self.source if isinstance(self.source, tuple) else tuple(self.source)


def load_trace(
    name_or_path: str | Path,
    *,
    throughputs: ThroughputTable | None = None,
    trace_filter: TraceFilter | str | None = None,
    replay_failures: bool = False,
) -> Trace:
    """Load a bundled trace (e.g. "muri/trace1", see `bundled_traces()`), a CSV file, a
    Gavel trace (tab-separated, no header) or a production trace (Philly's `cluster_job_log`,
    a Helios `cluster_log.csv`, an Acme `trace_*.csv`, the folder or tables of Alibaba PAI).

    The format is recognised from the content, not the file name. Gavel traces get their
    speeds from `throughputs` (default: Gavel's simulation profile); other formats ignore it.
    `trace_filter` (an expression, see `traces.filters`) keeps some of the jobs.
    `replay_failures`: a production trace's jobs fail where it records failures (their
    `fail_at`; see each reader) instead of running their recorded time and finishing.
    Raises TraceError (with file, line and column) for an unknown name or header, a malformed
    row, a duplicate job id or failures to replay from a trace that records none, and
    FilterError for a bad filter expression.
    """
    flt = parse_filter(trace_filter) if isinstance(trace_filter, str) else trace_filter
    name, path = resolve_trace(name_or_path)
    found = locate(path)
    if found is not None:
        return _load_stream(name, found[1], found[0], flt, replay_failures)
    layout = gavel.detect(path)
    assumptions: tuple[str, ...] = ()
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
        assumptions = fmt.assumptions
    if replay_failures:
        raise TraceError(path, None, None, f"the {fmt_name} format records no failures to "
                                           "replay; drop --replay-failures")
    _check_unique_ids(path, parsed)
    parsed.sort(key=lambda item: item[1].submit_time_s)  # list.sort is stable
    jobs = tuple(job for _, job in parsed)
    filtered_out = 0
    if flt is not None:
        kept = _filtered(path, fmt_name, jobs, flt)
        filtered_out = len(jobs) - len(kept)
        jobs = kept
    return Trace(
        name=name,
        path=path,
        format=fmt_name,
        source=jobs,
        default_overhead=overhead,
        profile=profile,
        filtered_out=filtered_out,
        assumptions=assumptions,
        trace_filter=flt,
    )


def _filtered(path: Path, fmt_name: str, jobs: tuple[JobSpec, ...],
              flt: TraceFilter) -> tuple[JobSpec, ...]:
    """A research trace's jobs the filter keeps; a window moves them (and their deadlines)
    back by its start, counted from the first submission."""
    if flt.states is not None:
        raise TraceError(path, None, None, f"the {fmt_name} format records no job states; "
                                           "drop state= from the trace filter")
    origin = jobs[0].submit_time_s if jobs else 0.0
    kept = [j for j in jobs if flt.admits(j.submit_time_s - origin, j.tenant, j.gpus, None)]
    if not flt.shift_s:
        return tuple(kept)
    back = origin + flt.shift_s
    return tuple(j.model_copy(update={
        "submit_time_s": max(0.0, j.submit_time_s - back),
        "deadline_s": None if j.deadline_s is None else j.deadline_s - back}) for j in kept)


def _build(item: Candidate, submit_s: float, replay_failures: bool) -> JobSpec:
    fields = item.fields
    fields["submit_time_s"] = submit_s
    if replay_failures and item.fail_at:
        fields["fail_at"] = item.fail_at
    return validated(item.where, item.columns, lambda: JobSpec.model_validate(fields))


def _load_stream(name: str, path: Path, fmt: StreamFormat, flt: TraceFilter | None,
                 replay_failures: bool) -> Trace:
    """Read a production trace once: check every record, count the jobs that never ran, and
    keep per job only what filtering and ordering need (a few numbers)."""
    if flt is not None and flt.states is not None and not fmt.has_states:
        raise TraceError(path, None, None, f"the {fmt.name} format records no job states; "
                                           "drop state= from the trace filter")
    skipped: dict[str, int] = {}
    submits: array[float] = array("d")
    restarts: array[int] = array("l")
    failures: array[int] = array("l")
    gpus: array[int] = array("l")
    tenant_of: array[int] = array("l")
    state_of: array[int] = array("l")
    tenants: dict[str, int] = {}
    states: dict[str | None, int] = {}
    ids: set[str] = set()
    for item in fmt.scan(path):
        if isinstance(item, str):
            skipped[item] = skipped.get(item, 0) + 1
            continue
        job = _build(item, 0.0, replay_failures)
        if job.job_id in ids:
            raise _duplicate(fmt, path, item, job.job_id)
        ids.add(job.job_id)
        submits.append(item.submit)
        restarts.append(item.restarts)
        failures.append(len(item.fail_at))
        if flt is not None:
            gpus.append(job.gpus)
            tenant_of.append(tenants.setdefault(job.tenant, len(tenants)))
            state_of.append(states.setdefault(item.state, len(states)))
    del ids
    candidates = len(submits)
    origin = min(submits) if candidates else 0.0
    keep: bytearray | None = None
    if flt is not None:
        tenant_names, state_names = list(tenants), list(states)
        keep = bytearray(
            flt.admits(submits[k] - origin, tenant_names[tenant_of[k]], gpus[k],
                       state_names[state_of[k]])
            for k in range(candidates))
        del gpus, tenant_of, state_of
    kept = list(compress(submits, keep)) if keep is not None else submits
    count = len(kept)
    in_order = all(map(operator.le, kept, islice(kept, 1, None)))
    rank = None if in_order else _ranks(submits, keep)
    total_restarts = sum(compress(restarts, keep) if keep is not None else restarts)
    total_failures = sum(compress(failures, keep) if keep is not None else failures)
    stream = JobStream(fmt, path, origin, flt.shift_s if flt else 0.0, count, candidates,
                       keep, rank, replay_failures)
    return Trace(
        name=name,
        path=path,
        format=fmt.name,
        source=stream,
        default_overhead=fmt.default_overhead,
        skipped=dict(sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))),
        filtered_out=candidates - count,
        restarts=total_restarts,
        assumptions=fmt.assumptions_for(replay_failures),
        trace_filter=flt,
        replay_failures=replay_failures,
        failures=total_failures,
    )


def _ranks(submits: array[float], keep: bytearray | None) -> array[int]:
    """Each kept job's place in submission order (ties in file order); -1 for the others."""
    indexes = [k for k in range(len(submits)) if keep is None or keep[k]]
    indexes.sort(key=submits.__getitem__)  # stable
    rank = array("l", [-1]) * len(submits)
    for place, k in enumerate(indexes):
        rank[k] = place
    return rank


def _duplicate(fmt: StreamFormat, path: Path, item: Candidate, job_id: str) -> TraceError:
    first = None
    for other in fmt.scan(path):
        if not isinstance(other, str) and other.fields["job_id"] == job_id:
            first = other.where.line
            break
    return item.where.error(item.columns.get("job_id"),
                            f"duplicate job id {job_id!r} (first on line {first})")


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
