"""`loom compare --traces a,b,c`: every policy on every trace, one table and one report.

Each `--traces` entry is `TRACE` or `TRACE@CLUSTER`: a trace as `--trace` takes it (bundled
name, file or folder), and the cluster it runs on (as `--cluster` takes it); an entry with
no `@CLUSTER` runs on `--cluster`. The runs (traces × policies) go to a pool of processes as
`loom compare --trace` sends its policies; what comes back is written as

    DIR/<trace>/<policy>/summary.json, jobs.csv   one run, as `loom sim` writes it
    DIR/<trace>/jct_cdf.png                       unless --no-plot
    DIR/compare.json                              every (trace, policy) run's summary
    DIR/report.html                               the self-contained report (loom.html_report)

<trace> is the trace's file or bundled name, with `@<cluster>` when the entry names its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import policies
from loom import html_report, trace_cli
from loom.cli_common import out, slug
from loom.plots import jct_cdf
from loom.progress import check_memory, estimate_bytes
from loom.replay import commands as replay_cli
from loom.report import matrix_table, write_run
from loom.runs import RunSpec, run_parallel
from loom.simulate import SimResult

SYNTAX = "TRACE[@CLUSTER],..."
TRACES_HELP = (
    "several traces, comma-separated, each TRACE or TRACE@CLUSTER (the cluster it runs on; "
    "without @CLUSTER: --cluster), e.g. muri/trace3@n8g8,helios_log.csv@helios/venus; the "
    "last @ of an entry splits it, so a trace path may hold @ but not a comma. Every policy "
    "runs on every trace; writes DIR/compare.json (every trace x policy), DIR/report.html "
    "(tables, JCT CDFs, time to start by job size, utilisation over time, tenant shares; "
    "opens offline) and DIR/<trace>/<policy>/")


@dataclass(frozen=True)
class TraceEntry:
    """One `--traces` entry: the trace, the cluster it runs on, and where its runs go."""

    text: str  # as written
    trace: str
    cluster: str
    own_cluster: bool  # named with @CLUSTER (else --cluster)
    folder: str  # DIR/<folder>/<policy>/

    @property
    def label(self) -> str:
        """How the report and the table name it: TRACE, or TRACE@CLUSTER."""
        return f"{self.trace}@{self.cluster}" if self.own_cluster else self.trace


def _folder(text: str) -> str:
    name = slug(Path(text).name) or slug(text)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "trace"


def parse_traces(text: str, default_cluster: str | None) -> list[TraceEntry]:
    """The entries of `--traces`; a ValueError naming the entry at fault otherwise."""
    entries: list[TraceEntry] = []
    seen: dict[tuple[str, str], str] = {}
    folders: set[str] = set()
    for n, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        if not item:
            raise ValueError(f"--traces {text!r}: entry {n} is empty (write {SYNTAX}, one "
                             "comma between entries)")
        trace, at, cluster = item.rpartition("@")
        if not at:
            trace, cluster = item, ""
        trace, cluster = trace.strip(), cluster.strip()
        if at and not trace:
            raise ValueError(f"--traces entry {item!r} names no trace before @ (write "
                             "TRACE@CLUSTER)")
        if at and not cluster:
            raise ValueError(f"--traces entry {item!r} names no cluster after @ (write "
                             "TRACE@CLUSTER, or TRACE alone to run it on --cluster)")
        if not at and default_cluster is None:
            raise ValueError(f"--traces entry {item!r} names no cluster: write "
                             f"{item}@CLUSTER, or give --cluster for the entries without one")
        own = bool(at)
        cluster = cluster if own else str(default_cluster)
        if (trace, cluster) in seen:
            raise ValueError(f"--traces lists {trace} on {cluster} twice ({seen[trace, cluster]!r}"
                             f" and {item!r})")
        seen[trace, cluster] = item
        base = _folder(trace) + (f"@{_folder(cluster)}" if own else "")
        folder, k = base, 2
        while folder in folders:  # two traces of the same file name
            folder, k = f"{base}-{k}", k + 1
        folders.add(folder)
        entries.append(TraceEntry(text=item, trace=trace, cluster=cluster, own_cluster=own,
                                  folder=folder))
    return entries


@dataclass(frozen=True)
class Prepared:
    """An entry's runs, checked: one spec per policy, what its trace left out (`note`), what
    each run's summary should record of how the trace was read (`annotations`), and the
    memory one run is estimated to need."""

    entry: TraceEntry
    specs: tuple[RunSpec, ...]
    note: str | None
    annotations: dict[str, object]
    jobs: int
    nodes: int

    @property
    def estimate(self) -> float:
        return estimate_bytes(self.jobs, self.nodes)


def prepare(entries: Sequence[TraceEntry], names: Sequence[str],
            spec_for: Callable[[str], RunSpec], log: Path | None,
            trace_filter: str | None, replay_failures: bool = False) -> list[Prepared]:
    """Every run's spec, checked before any starts: the policies, then each entry's trace
    (read with the trace options: `trace_filter`, `replay_failures`) and cluster (an error
    names the entry)."""
    for name in names:
        policies.policy_class(name)  # UnknownPolicy before any trace is read
    per_entry: list[list[RunSpec]] = []
    for entry in entries:
        specs = []
        for name in names:
            spec = dataclasses.replace(spec_for(name), trace=entry.trace, cluster=entry.cluster)
            if log is not None:
                spec = replay_cli.logged(spec, log / entry.folder / f"{name}.eventlog.gz")
            specs.append(trace_cli.traced(spec, trace_filter, replay_failures))
        per_entry.append(specs)
    prepared = []
    for entry, specs in zip(entries, per_entry, strict=True):
        try:
            for spec in specs:
                spec.validate()
            trace = trace_cli.loaded(specs[0])
            cfg = specs[0].config()
        except ValueError as exc:  # TraceError among them
            raise ValueError(f"--traces entry {entry.text!r}: {exc}") from exc
        annotations: dict[str, object] = {}
        trace_cli.annotate(annotations, trace)
        prepared.append(Prepared(entry=entry, specs=tuple(specs),
                                 note=trace_cli.trace_note(trace), annotations=annotations,
                                 jobs=cfg.total_jobs, nodes=len(cfg.cluster.nodes)))
    return prepared


@dataclass
class MatrixRun:
    """What `run` did: per entry, its runs' summaries in policy order."""

    dest: Path
    prepared: list[Prepared]
    summaries: list[list[dict[str, object]]]


def default_dest(entries: Sequence[TraceEntry]) -> Path:
    return Path("runs") / ("+".join(e.folder for e in entries)[:100] + "-matrix")


def run(prepared: Sequence[Prepared], dest: Path, *, processes: int = 0, quiet: bool = False,
        memory_check: bool = True, plot: bool = True, command: str | None = None) -> MatrixRun:
    """Run the matrix in parallel processes, write every output, print the one table."""
    specs = [s for p in prepared for s in p.specs]
    where = [(p, s) for p in prepared for s in p.specs]
    workers = min(len(specs), processes or os.cpu_count() or 1)
    if memory_check and prepared:
        biggest = max(prepared, key=lambda p: p.estimate)
        if biggest.jobs:
            check_memory(biggest.jobs, biggest.nodes, runs=workers)
    # The largest traces first, so a long run does not start last.
    order = sorted(range(len(specs)), key=lambda i: -where[i][0].estimate)
    labels = [f"{p.entry.label} {s.policy}" for p, s in where]
    results = run_parallel(specs, labels, processes, order=order, quiet=quiet)

    sections: list[html_report.TraceSection] = []
    summaries: list[list[dict[str, object]]] = []
    rows: list[dict[str, object]] = []
    table: list[tuple[str, dict[str, object]]] = []
    at = 0
    for p in prepared:
        mine: list[SimResult] = results[at:at + len(p.specs)]
        at += len(p.specs)
        cells = []
        for result in mine:
            result.summary.update(p.annotations)
            policy = str(result.summary["policy"])
            write_run(dest / p.entry.folder / policy, result.summary, result.jobs)
            rows.append({"entry": p.entry.label, "out": f"{p.entry.folder}/{policy}",
                         **result.summary})
            table.append((p.entry.label, result.summary))
            cells.append(html_report.cell_data(result.summary, result.jobs,
                                               result.utilisation))
        first = mine[0].summary
        title = (f"{first['trace']} on {first['cluster']} ({first['bus']} bus), "
                 f"{first['jobs']:,} jobs" if isinstance(first["jobs"], int) else "")
        if plot:
            jct_cdf({str(r.summary["policy"]): [j.jct_s for j in r.jobs if j.jct_s is not None]
                     for r in mine}, dest / p.entry.folder / "jct_cdf.png", title)
        sections.append(html_report.TraceSection(
            label=p.entry.label, title=title, cells=tuple(cells), note=p.note,
            anchor=f"trace-{len(sections) + 1}"))
        summaries.append([r.summary for r in mine])
    (dest / "compare.json").write_text(json.dumps(rows, indent=2) + "\n")
    names = [s.policy for s in prepared[0].specs] if prepared else []
    html_report.write_report(dest / "report.html", sections, names, command)
    out.print(matrix_table(table, f"{len(names)} policies on {len(prepared)} traces"))
    return MatrixRun(dest=dest, prepared=list(prepared), summaries=summaries)
