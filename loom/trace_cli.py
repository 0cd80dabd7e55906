"""Production traces on the command line: `--trace-filter` and `--replay-failures` for
`loom sim`/`loom compare`, the one-line account of what a trace left out, `loom gen-tenants`,
and their `loom traces` tables.

The trace options ride on the run spec (`traced`): a RunSpec whose trace is read with them,
and read once per command (`validate`, `config` and the note share it through a small
cache), where a plain RunSpec reads it for each."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from loom.cli_common import err, out
from loom.replay.commands import LoggedRunSpec
from loom.runs import RunSpec
from traces import PRODUCTION_CLUSTERS, PRODUCTION_TRACES, load_trace
from traces.filters import SYNTAX
from traces.loader import Trace
from traces.tenants import generate, to_toml
from traces.throughputs import load_throughputs

FILTER_HELP = (f"keep some of the trace's jobs: {SYNTAX} (window in s, or with m/h/d, from "
               "the first submission; see docs/traces/)")


REPLAY_HELP = ("production traces: replay the failures they record instead of running each "
               "job's recorded time to completion. Philly: a job fails at the end of each "
               "attempt but the last and is restarted from there (past the retry budget, as "
               "Philly retried it), and a Failed job's last run fails for good; Helios and "
               "Acme FAILED jobs and PAI Failed tasks fail for good at their recorded time. "
               "Failed jobs show as failed in summary.json and jobs.csv; see docs/traces/")


def add_filter_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-filter", metavar="EXPR", help=FILTER_HELP)


def add_replay_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replay-failures", action="store_true", help=REPLAY_HELP)


@functools.lru_cache(maxsize=4)
def cached_trace(trace: str, throughputs: str | None, trace_filter: str | None,
                 replay_failures: bool = False) -> Trace:
    """The trace a run reads, loaded once per process (a run's checks and its run share it)."""
    table = load_throughputs(throughputs) if throughputs else None
    return load_trace(trace, throughputs=table, trace_filter=trace_filter,
                      replay_failures=replay_failures)


@dataclasses.dataclass(frozen=True)
class TracedRunSpec(RunSpec):
    """A run whose trace is read through `--trace-filter` (None: the whole trace), its
    recorded failures replayed or not (`--replay-failures`)."""

    trace_filter: str | None = None
    replay_failures: bool = False

    def _trace(self) -> Trace:
        return cached_trace(self.trace, self.throughputs, self.trace_filter,
                            self.replay_failures)


@dataclasses.dataclass(frozen=True)
class TracedLoggedRunSpec(LoggedRunSpec):
    """The same, for a run that also writes its event log (`--log`)."""

    trace_filter: str | None = None
    replay_failures: bool = False

    def _trace(self) -> Trace:
        return cached_trace(self.trace, self.throughputs, self.trace_filter,
                            self.replay_failures)


_TRACE_OPTIONS = ("trace_filter", "replay_failures")


def traced(spec: RunSpec, trace_filter: str | None, replay_failures: bool = False) -> RunSpec:
    """`spec` reading its trace through `trace_filter` (and replaying its recorded failures),
    once per process.

    A command calls this before it reads anything, so it also forgets the traces earlier
    commands in this process read (a file may have changed since)."""
    cached_trace.cache_clear()
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
              if f.name not in _TRACE_OPTIONS}
    if isinstance(spec, LoggedRunSpec):
        return TracedLoggedRunSpec(**fields, trace_filter=trace_filter,
                                   replay_failures=replay_failures)
    return TracedRunSpec(**fields, trace_filter=trace_filter, replay_failures=replay_failures)


def loaded(spec: RunSpec) -> Trace:
    """The trace `spec` runs (from the cache when `traced` made it)."""
    return cached_trace(spec.trace, spec.throughputs, getattr(spec, "trace_filter", None),
                        getattr(spec, "replay_failures", False))


def trace_note(trace: Trace) -> str | None:
    """One line on what a production or filtered trace left out; None for a trace that read
    every row as a job."""
    if not (trace.skipped or trace.filtered_out or trace.restarts or trace.trace_filter
            or trace.replay_failures):
        return None
    parts = [f"{trace.job_count:,} jobs"]
    never = sum(trace.skipped.values())
    if never:
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in trace.skipped.items())
        parts.append(f"{never:,} records left out ({reasons})")
    if trace.trace_filter is not None:
        parts.append(f"{trace.filtered_out:,} outside --trace-filter "
                     f"{trace.trace_filter.text!r}")
    if trace.replay_failures:
        parts.append(f"{trace.failures:,} recorded failures to replay")
    elif trace.restarts:
        parts.append(f"{trace.restarts:,} restarts counted, not replayed")
    return f"trace {trace.name} ({trace.format}): " + "; ".join(parts)


def print_note(trace: Trace) -> None:
    note = trace_note(trace)
    if note is not None:
        out.print(escape(note), highlight=False)


def annotate(summary: dict[str, object], trace: Trace) -> None:
    """Record in a run's summary how its trace was read, when that is more than the file:
    the format's assumptions (duration-only traces), the filter and what was left out."""
    if not (trace.assumptions or trace.trace_filter or trace.skipped):
        return
    summary["trace_format"] = trace.format
    summary["trace_assumptions"] = list(trace.assumptions)
    summary["trace_skipped"] = dict(trace.skipped)
    summary["trace_filter"] = None if trace.trace_filter is None else trace.trace_filter.text
    summary["trace_filtered_out"] = trace.filtered_out
    summary["trace_restarts"] = trace.restarts
    summary["trace_replay_failures"] = trace.replay_failures


def formats_table() -> Table:
    table = Table(title="Production trace formats (download the files; not bundled)",
                  title_justify="left")
    table.add_column("format")
    table.add_column("trace")
    table.add_column("licence")
    table.add_column("source and docs", overflow="fold")
    for t in PRODUCTION_TRACES:
        table.add_row(t.format, t.title, t.licence, f"{t.source}\n{t.docs}")
    return table


def clusters_table() -> Table:
    table = Table(title="Production clusters (--cluster NAME; sizes as the papers report)",
                  title_justify="left")
    for col in ("name", "GPUs", "machines", "GPU type"):
        table.add_column(col)
    table.add_column("source", overflow="fold")
    for c in PRODUCTION_CLUSTERS:
        table.add_row(c.name, f"{c.gpus:,}", f"{c.machines:,}", c.gpu_type, c.source)
    return table


def add_commands(sub: Any) -> None:
    gen = sub.add_parser(
        "gen-tenants", help="write a tenants file from a production trace",
        description="From Helios' cluster_gpu_number.csv: one tenant per VC, its quota "
                    "(max_gpus) and weight its GPUs on --date (default: the last day). From "
                    "any trace (Philly's cluster_job_log, a Helios or Acme log, ...): one "
                    "tenant per VC or user, weighted by its share of the trace's GPU time, "
                    "no quota. Use the file with `loom sim --tenants`.")
    gen.add_argument("source", help="cluster_gpu_number.csv, or a trace (file, folder or "
                                    "bundled name)")
    gen.add_argument("--out", type=Path, help="TOML file to write (default: print it)")
    gen.add_argument("--date", help="cluster_gpu_number.csv: the day to take, as written in "
                                    "its date column")
    add_filter_option(gen)


def cmd_gen_tenants(args: argparse.Namespace) -> int:
    made = generate(args.source, args.date, args.trace_filter)
    text = to_toml(made.config, f"Generated by loom gen-tenants from {made.source}")
    if args.out is None:
        print(text, end="")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        out.print(f"wrote {escape(str(args.out))}: {len(made.config.tenants)} tenants "
                  f"({escape(made.source)})", highlight=False)
    if made.left_out:
        err.print(f"left out (no GPUs that day): {escape(', '.join(made.left_out))}",
                  highlight=False)
    return 0


COMMANDS = {"gen-tenants": cmd_gen_tenants}
