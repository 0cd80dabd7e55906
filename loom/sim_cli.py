"""`loom sim` and `loom compare`: one policy, or several in parallel, on a trace."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

from rich.markup import escape

from domain.placement import SCHEMES
from loom import compare_traces, trace_cli
from loom.cli_common import non_negative, out, overhead, positive, slug
from loom.plots import jct_cdf
from loom.progress import check_memory, run_reported
from loom.replay import commands as replay_cli
from loom.report import (
    forecast_line,
    incomplete,
    outcome_line,
    results_table,
    solver_line,
    write_run,
)
from loom.runs import RunSpec, compare
from loom.simulate import SimResult
from schemas.cluster import LIMITS_TEXT

CLUSTER_HELP = ("bundled name (n8g8), cluster-spec CSV or JSON, or GPU counts per type "
                f"V100:P100:K80 (36:36:36); whatever the form, {LIMITS_TEXT}")


def _add_run_options(p: argparse.ArgumentParser, several: bool = False) -> None:
    """The flags of a run; `several`: `loom compare`, which also takes `--traces` (then
    `--cluster` is the default of the entries that name none)."""
    if not several:
        p.add_argument("--trace", required=True, help="bundled name (muri/trace1) or CSV path")
        p.add_argument("--cluster", required=True, help=CLUSTER_HELP)
    else:
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--trace", help="bundled name (muri/trace1) or CSV path")
        which.add_argument("--traces", metavar=compare_traces.SYNTAX,
                           help=compare_traces.TRACES_HELP)
        p.add_argument("--cluster", help=CLUSTER_HELP + " (required with --trace; with "
                                                        "--traces: the cluster of every entry "
                                                        "without @CLUSTER)")
    p.add_argument("--gpus-per-server", default="4",
                   help="with GPU counts: GPUs per server, N or N:N:N per type (default 4)")
    p.add_argument("--throughputs", help="per-GPU-type throughput JSON for Gavel traces "
                                         "(default: Gavel's bundled simulation table)")
    p.add_argument("--bus", choices=("memory", "nats"), default="memory",
                   help="in-process bus, or NATS JetStream (default: memory)")
    p.add_argument("--nats-url", help="NATS server; default with --bus nats: start a private one")
    p.add_argument("--round-s", type=positive,
                   help="re-plan every S seconds (round-based) instead of on every event")
    p.add_argument("--gpu-type", choices=("A100", "T4"),
                   help="make deadline-trace jobs elastic with ElasticFlow's throughput table "
                        "for this GPU (speed by GPU count)")
    p.add_argument("--free-at-once", action="store_true",
                   help="round-based runs: give a finished job's GPUs out at once instead of "
                        "at the end of the round (Gavel's behaviour)")
    p.add_argument("--overhead", type=overhead,
                   help="none | muri | elasticflow | elasticflow-baseline | flat:SECONDS | "
                        "profile:FILE (default: the trace's origin; with --profile, its "
                        "overheads.json)")
    p.add_argument("--profile", dest="measured", metavar="DIR",
                   help="a `loom profile` folder: jobs of profiled workloads run at the measured "
                        "speeds and stage times instead of the trace's constants")
    p.add_argument("--placement", choices=SCHEMES,
                   help="placement scheme (default: the policy's); yarn = the research "
                        "simulators' first-fit re-pack, for compatibility runs")
    p.add_argument("--seed", type=int, default=0, help="seed for any randomness (default 0)")
    p.add_argument("--tenants", help="tenants file (TOML or JSON): weight, max_gpus, "
                                     "max_queued per tenant; queues and cohorts with quotas, "
                                     "borrowing and reclaim (docs/queues.md) (default: no "
                                     "limits)")
    p.add_argument("--forecast-every", type=non_negative, metavar="S",
                   help="forecast waiting jobs' start times at most every S seconds of "
                        "cluster time (0: after every cycle) and put their error in the "
                        "summary (forecast_error_s); decisions are unchanged (default: none)")
    p.add_argument("--log-level", default="warning", help="service log level (default warning)")
    trace_cli.add_filter_option(p)
    trace_cli.add_replay_option(p)
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when any job was rejected or left unfinished (default: only "
                        "service errors fail the run)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress (default: a live bar on a terminal, else a line every "
                        "10 s on stderr)")
    p.add_argument("--no-memory-check", action="store_true",
                   help="run even if the estimate of the memory it needs (from jobs x nodes) "
                        "is over 80%% of the memory available")


def _add_no_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-plot", action="store_true",
                   help="skip jct_cdf.png (batch runs: drawing it takes longer than a short "
                        "simulation)")


COMPARE_DESCRIPTION = """\
Simulate several policies, each in its own process, and print one table.

  one trace:      loom compare --trace muri/trace3 --cluster n8g8 --policies fifo,srtf
                  writes DIR/compare.json, DIR/jct_cdf.png and DIR/<policy>/
  several traces: loom compare --traces muri/trace3@n8g8,tiresias/60_job@n1g4 \\
                      --policies fifo,srtf,tiresias
                  every policy on every trace; an entry is TRACE or TRACE@CLUSTER, and
                  --cluster is the cluster of the entries without @CLUSTER. Writes
                  DIR/compare.json (a row per trace x policy), DIR/report.html (a page that
                  opens offline: results tables, JCT CDFs, time to first start by job size,
                  utilisation over time, tenant shares), DIR/<trace>/jct_cdf.png and
                  DIR/<trace>/<policy>/{summary.json,jobs.csv}
"""


def add_commands(sub: Any) -> None:
    sim = sub.add_parser("sim", help="simulate one policy on a trace")
    _add_run_options(sim)
    sim.add_argument("--policy", required=True, help="a registered policy (see `loom policies`)")
    sim.add_argument("--out", type=Path, help="output directory (default runs/<trace>-<policy>)")
    sim.add_argument("--log", type=Path, help="also write the run's event log to this file "
                                              "(.gz: gzipped; see `loom replay`)")
    _add_no_plot(sim)

    cmp_ = sub.add_parser(
        "compare", help="simulate several policies on one trace, or on several (--traces)",
        description=COMPARE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_options(cmp_, several=True)
    cmp_.add_argument("--policies", required=True, help="comma-separated, e.g. srtf,tiresias")
    cmp_.add_argument("--out", type=Path, help="output directory (default runs/<trace>-compare; "
                                               "with --traces runs/<trace>+<trace>...-matrix)")
    cmp_.add_argument("--processes", type=int, default=0,
                      help="parallel processes (default: one per policy, with --traces one "
                           "per trace x policy, up to the CPU count)")
    cmp_.add_argument("--log", type=Path,
                      help="also write each run's event log to DIR/<policy>.eventlog.gz "
                           "(with --traces DIR/<trace>/<policy>.eventlog.gz)")
    _add_no_plot(cmp_)


def _spec(args: argparse.Namespace, policy: str) -> RunSpec:
    return RunSpec(
        trace=args.trace, cluster=args.cluster, policy=policy, bus=args.bus,
        nats_url=args.nats_url, round_s=args.round_s, overhead=args.overhead,
        free_at_once=args.free_at_once, gpu_type=args.gpu_type,
        placement=args.placement, seed=args.seed,
        log_level=args.log_level, gpus_per_server=args.gpus_per_server,
        throughputs=args.throughputs, tenants=args.tenants, measured=args.measured,
        forecast_every_s=args.forecast_every,
    )


def _jcts(result: SimResult) -> list[float]:
    return [j.jct_s for j in result.jobs if j.jct_s is not None]


def _title(summary: dict[str, object]) -> str:
    return f"{summary['trace']} on {summary['cluster']} ({summary['bus']} bus)"


def cmd_sim(args: argparse.Namespace) -> int:
    spec = _spec(args, args.policy)
    if args.log is not None:
        spec = replay_cli.logged(spec, args.log)
    spec = trace_cli.traced(spec, args.trace_filter, args.replay_failures)
    spec.validate()
    trace_cli.print_note(trace_cli.loaded(spec))
    dest = args.out or Path("runs") / f"{slug(Path(args.trace).name)}-{args.policy}"
    result = run_reported(spec, quiet=args.quiet, memory_check=not args.no_memory_check)
    trace_cli.annotate(result.summary, trace_cli.loaded(spec))
    write_run(dest, result.summary, result.jobs)
    if not args.no_plot:
        jct_cdf({args.policy: _jcts(result)}, dest / "jct_cdf.png", _title(result.summary))
    out.print(results_table([result.summary], _title(result.summary)))
    _print_outcomes([result.summary], label=False)
    plot = "" if args.no_plot else " and jct_cdf.png"
    out.print(f"wrote {dest}/summary.json, jobs.csv{plot}")
    return _exit_code([result.summary], args.strict)


def _print_outcomes(summaries: list[dict[str, object]], label: bool) -> None:
    """Every run's outcomes under the table; a run that rejected jobs, or left some
    unfinished, says so in yellow (they are in jobs.csv with their state)."""
    for s in summaries:
        who = f"{escape(str(s['policy']))}: " if label else ""
        line = who + escape(outcome_line(s))
        out.print(f"[yellow]{line}[/yellow]" if incomplete(s) else line, highlight=False)
        forecasts = forecast_line(s)
        if forecasts is not None:
            out.print(who + escape(forecasts), highlight=False)
        solver = solver_line(s)
        if solver is not None:
            out.print(who + escape(solver), highlight=False)
        rejected = s.get("rejected")
        if isinstance(rejected, int) and rejected:
            out.print(f"[yellow]warning:[/yellow] {who}{rejected:,} of {s['jobs']:,} jobs were "
                      "rejected: they never ran and no average above counts them (jobs.csv "
                      "lists them with state rejected; --strict fails such a run)",
                      highlight=False)


def _exit_code(summaries: list[dict[str, object]], strict: bool) -> int:
    """1 on service errors, or with --strict on a rejected or unfinished job; else 0."""
    if any(s["errors"] != 0 for s in summaries):
        return 1
    if strict and any(incomplete(s) for s in summaries):
        return 1
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not names:
        raise ValueError("--policies is empty")
    if len(set(names)) != len(names):
        raise ValueError(f"--policies lists a policy twice: {args.policies}")
    if args.traces is not None:
        return _compare_traces(args, names)
    if args.cluster is None:
        raise ValueError("--cluster is required with --trace (with --traces, an entry may "
                         "name its own: TRACE@CLUSTER)")
    specs = [_spec(args, name) for name in names]
    if args.log is not None:
        specs = [replay_cli.logged(s, args.log / f"{s.policy}.eventlog.gz") for s in specs]
    specs = [trace_cli.traced(s, args.trace_filter, args.replay_failures) for s in specs]
    for s in specs:
        s.validate()
    trace_cli.print_note(trace_cli.loaded(specs[0]))
    dest = args.out or Path("runs") / f"{slug(Path(args.trace).name)}-compare"
    if not args.no_memory_check:
        cfg = specs[0].config()
        check_memory(cfg.total_jobs, len(cfg.cluster.nodes),
                     runs=min(len(specs), args.processes or os.cpu_count() or 1))
    results = compare(specs, processes=args.processes, quiet=args.quiet)
    for r in results:
        trace_cli.annotate(r.summary, trace_cli.loaded(specs[0]))
        write_run(dest / str(r.summary["policy"]), r.summary, r.jobs)
    summaries = [r.summary for r in results]
    out.print(results_table(summaries, _title(summaries[0])))
    _print_outcomes(summaries, label=True)
    (dest / "compare.json").write_text(json.dumps(summaries, indent=2) + "\n")
    plot = ""
    if not args.no_plot:
        jct_cdf({str(r.summary["policy"]): _jcts(r) for r in results}, dest / "jct_cdf.png",
                _title(summaries[0]))
        plot = ", jct_cdf.png"
    out.print(f"wrote {dest}/compare.json{plot} and {dest}/<policy>/")
    return _exit_code(summaries, args.strict)


def _compare_traces(args: argparse.Namespace, names: list[str]) -> int:
    """`loom compare --traces`: every policy on every trace (loom.compare_traces)."""
    entries = compare_traces.parse_traces(args.traces, args.cluster)
    prepared = compare_traces.prepare(entries, names, lambda name: _spec(args, name),
                                      args.log, args.trace_filter, args.replay_failures)
    for p in prepared:
        if p.note is not None:
            out.print(escape(p.note), highlight=False)
    dest = args.out or compare_traces.default_dest(entries)
    command = shlex.join(["loom", *getattr(args, "invocation", [])])
    done = compare_traces.run(prepared, dest, processes=args.processes, quiet=args.quiet,
                              memory_check=not args.no_memory_check, plot=not args.no_plot,
                              command=command)
    for p, summaries in zip(done.prepared, done.summaries, strict=True):
        out.print(f"{escape(p.entry.label)}:", highlight=False)
        _print_outcomes(summaries, label=True)
    where = escape(str(dest))
    plot = "" if args.no_plot else f", {where}/<trace>/jct_cdf.png"
    out.print(f"wrote {where}/compare.json, {where}/report.html{plot} and "
              f"{where}/<trace>/<policy>/", highlight=False)
    return _exit_code([s for group in done.summaries for s in group], args.strict)


COMMANDS = {"sim": cmd_sim, "compare": cmd_compare}
