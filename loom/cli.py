"""`loom`: the single command-line entry point.

    loom sim        run one policy on a trace (memory bus, or NATS JetStream with --bus nats)
    loom compare    run several policies on the same trace, in parallel, and print one table
    loom sweep      avg JCT against input job rate, policies × rates × seeds (Gavel's method)
    loom gen-trace  write a synthetic trace drawn as Gavel's or ElasticFlow's generator draws it
    loom policies   list the registered policies
    loom traces     list the bundled traces and clusters
    loom replay     check an event log against fresh cores, or what-if another policy
    loom log export write a live JetStream stream as an event log file
    loom profile    measure workloads with the real trainer: throughput tables, stage times,
                    restart/resize overheads (for `loom sim --profile`)

  live cluster:
    loom up         start NATS, the control plane and local node agents
    loom serve      run one service (scheduler, placer, metrics, injector, nodeagent)
    loom submit     submit a job and print its id
    loom status     jobs with state, reason, queue position, GPUs, progress and ETA
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import policies
from domain.overhead import parse_overhead
from domain.placement import SCHEMES
from loom import live_args
from loom.plots import jct_cdf, jct_vs_load
from loom.profile import add_profile_command, cmd_profile
from loom.replay import commands as replay_cli
from loom.report import results_table, sweep_table, write_run
from loom.runs import RunSpec, compare, run_one
from loom.simulate import SimResult
from loom.sweep import Sweep, curves, run_sweep, write_csv, write_json
from services.runtime.logging import configure
from services.runtime.nats_errors import NatsProblem
from services.runtime.natsserver import NatsServerError
from traces import TraceError, bundled_clusters, bundled_traces, load_throughputs
from traces.elasticflow_generator import generate_elasticflow_jobs, write_elasticflow_trace
from traces.gavel_generator import DISTRIBUTIONS, generate_gavel_jobs, write_gavel_trace

# Wide enough for the results table when piped to a file or CI log.
out = Console(width=None if sys.stdout.isatty() else 160)
# One message, one line, even in a log; user text (paths, values such as 36:x:36) printed as
# given: no emoji codes, and markup escaped where messages are built.
err = Console(stderr=True, soft_wrap=True, emoji=False)

_T = TypeVar("_T")


def _overhead(text: str) -> str:
    try:
        parse_overhead(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="bundled name (muri/trace1) or CSV path")
    p.add_argument("--cluster", required=True,
                   help="bundled name (n8g8), cluster-spec CSV or JSON, or GPU counts per type "
                        "V100:P100:K80 (36:36:36)")
    p.add_argument("--gpus-per-server", default="4",
                   help="with GPU counts: GPUs per server, N or N:N:N per type (default 4)")
    p.add_argument("--throughputs", help="per-GPU-type throughput JSON for Gavel traces "
                                         "(default: Gavel's bundled simulation table)")
    p.add_argument("--bus", choices=("memory", "nats"), default="memory",
                   help="in-process bus, or NATS JetStream (default: memory)")
    p.add_argument("--nats-url", help="NATS server; default with --bus nats: start a private one")
    p.add_argument("--round-s", type=_positive,
                   help="re-plan every S seconds (round-based) instead of on every event")
    p.add_argument("--gpu-type", choices=("A100", "T4"),
                   help="make deadline-trace jobs elastic with ElasticFlow's throughput table "
                        "for this GPU (speed by GPU count)")
    p.add_argument("--free-at-once", action="store_true",
                   help="round-based runs: give a finished job's GPUs out at once instead of "
                        "at the end of the round (Gavel's behaviour)")
    p.add_argument("--overhead", type=_overhead,
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
                                     "max_queued per tenant (default: no limits)")
    p.add_argument("--log-level", default="warning", help="service log level (default warning)")


def _add_gavel_job_options(p: argparse.ArgumentParser, distribution: str) -> None:
    p.add_argument("--multi-gpu", action="store_true",
                   help="draw multi-GPU jobs as Gavel's -m does (default: 1 GPU each)")
    p.add_argument("--multi-priority", action="store_true",
                   help="give 20%% of the jobs priority weight 5, as Gavel does")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default=distribution,
                   help="trace: Gavel's generate_trace.py; philly: the jobs Gavel's simulator "
                        f"generates itself (default {distribution})")
    p.add_argument("--throughputs", help="per-GPU-type throughput JSON "
                                         "(default: Gavel's bundled simulation table)")


def _add_no_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-plot", action="store_true",
                   help="skip jct_cdf.png (batch runs: drawing it takes longer than a short "
                        "simulation)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loom", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("sim", help="simulate one policy on a trace")
    _add_run_options(sim)
    sim.add_argument("--policy", required=True, help="a registered policy (see `loom policies`)")
    sim.add_argument("--out", type=Path, help="output directory (default runs/<trace>-<policy>)")
    sim.add_argument("--log", type=Path, help="also write the run's event log to this file "
                                              "(.gz: gzipped; see `loom replay`)")
    _add_no_plot(sim)

    cmp_ = sub.add_parser("compare", help="simulate several policies on one trace")
    _add_run_options(cmp_)
    cmp_.add_argument("--policies", required=True, help="comma-separated, e.g. srtf,tiresias")
    cmp_.add_argument("--out", type=Path, help="output directory (default runs/<trace>-compare)")
    cmp_.add_argument("--processes", type=int, default=0,
                      help="parallel processes (default: one per policy, up to the CPU count)")
    cmp_.add_argument("--log", type=Path,
                      help="also write each run's event log to DIR/<policy>.eventlog.gz")
    _add_no_plot(cmp_)

    sweep = sub.add_parser(
        "sweep", help="avg JCT against input job rate on synthetic Gavel traces",
        description="Policies × input job rates × seeds on traces drawn as Gavel draws them, "
                    "in parallel; measures the average JCT of a window of job IDs (Gavel's "
                    "steady-state method) and writes sweep.csv, sweep.json, jct_vs_load.png.")
    sweep.add_argument("--policies", required=True, help="comma-separated, e.g. fifo-perf,"
                                                         "max-min-fairness-perf")
    sweep.add_argument("--rates", required=True,
                       help="input job rates in jobs per hour, comma-separated (Poisson "
                            "arrivals, mean gap 3600/rate s)")
    sweep.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    sweep.add_argument("--cluster", required=True,
                       help="GPU counts per type V100:P100:K80 (36:36:36), a bundled name or a "
                            "cluster-spec file")
    sweep.add_argument("--gpus-per-server", default="4",
                       help="with GPU counts: GPUs per server, N or N:N:N per type (default 4)")
    sweep.add_argument("--jobs", type=int, default=1000, help="jobs per trace (default 1000)")
    sweep.add_argument("--window", help="START:END, the job IDs measured (0-based, END "
                                        "excluded; default: the middle third of --jobs)")
    _add_gavel_job_options(sweep, "philly")
    sweep.add_argument("--round-s", type=_positive,
                       help="re-plan every S seconds (default: the policy's own; 360 s rounds "
                            "for Gavel's policies)")
    sweep.add_argument("--processes", type=int, default=0,
                       help="parallel processes (default: up to the CPU count)")
    sweep.add_argument("--run-to-completion", action="store_true",
                       help="run every job to the end (default: stop once the window's jobs "
                            "have finished, as Gavel does)")
    sweep.add_argument("--save-traces", action="store_true",
                       help="keep each trace as OUT/traces/rate<R>-seed<S>.trace (Gavel format)")
    sweep.add_argument("--out", type=Path, help="output directory (default runs/sweep-<cluster>)")
    sweep.add_argument("--log-level", default="warning", help="service log level (default warning)")

    gen = sub.add_parser("gen-trace", help="write a synthetic trace as Gavel's or "
                                           "ElasticFlow's generator draws it")
    gen.add_argument("generator", choices=("gavel", "elasticflow"),
                     help="gavel: traces.gavel_generator, Gavel's 10-field format; elasticflow: "
                          "traces.elasticflow_generator, ElasticFlow's deadline CSV")
    gen.add_argument("--jobs", type=int, required=True, help="number of jobs")
    arrivals = gen.add_mutually_exclusive_group(required=True)
    arrivals.add_argument("--lam", help="mean inter-arrival time in seconds (0: all at t=0)")
    arrivals.add_argument("--rate", help="input job rate in jobs per hour (lam = 3600 / rate)")
    gen.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    _add_gavel_job_options(gen, "trace")
    gen.set_defaults(distribution=None)  # None: not given, so elasticflow can refuse it
    ef = gen.add_argument_group("elasticflow only (always multi-GPU, as the artifact)")
    ef.add_argument("--gpu-type", choices=("A100", "T4"),
                    help="ElasticFlow throughput table for the iterations (default A100)")
    ef.add_argument("--min-ddl", help="deadline factor U(min, max) × duration (default 0.5)")
    ef.add_argument("--max-ddl", help="(default 1.5)")
    ef.add_argument("--best-effort", help="share of best-effort jobs, 0 to 1 (default 0)")
    ef.add_argument("--max-gpus", type=int, help="most GPUs for a job (default 16)")
    gen.add_argument("--out", type=Path, required=True, help="trace file to write")

    add_profile_command(sub)
    sub.add_parser("policies", help="list registered policies")
    sub.add_parser("traces", help="list bundled traces and clusters")
    live_args.add_live_commands(sub, _positive, _overhead)
    replay_cli.add_commands(sub, _positive, _overhead)
    return parser


def _slug(text: str) -> str:
    return text.replace("/", "_").replace("\\", "_").removesuffix(".csv")


def _spec(args: argparse.Namespace, policy: str) -> RunSpec:
    return RunSpec(
        trace=args.trace, cluster=args.cluster, policy=policy, bus=args.bus,
        nats_url=args.nats_url, round_s=args.round_s, overhead=args.overhead,
        free_at_once=args.free_at_once, gpu_type=args.gpu_type,
        placement=args.placement, seed=args.seed,
        log_level=args.log_level, gpus_per_server=args.gpus_per_server,
        throughputs=args.throughputs, tenants=args.tenants, measured=args.measured,
    )


def _jcts(result: SimResult) -> list[float]:
    return [j.jct_s for j in result.jobs if j.jct_s is not None]


def _title(summary: dict[str, object]) -> str:
    return f"{summary['trace']} on {summary['cluster']} ({summary['bus']} bus)"


def cmd_sim(args: argparse.Namespace) -> int:
    spec = _spec(args, args.policy)
    if args.log is not None:
        spec = replay_cli.logged(spec, args.log)
    spec.validate()
    dest = args.out or Path("runs") / f"{_slug(Path(args.trace).name)}-{args.policy}"
    result = run_one(spec, progress=True)
    write_run(dest, result.summary, result.jobs)
    if not args.no_plot:
        jct_cdf({args.policy: _jcts(result)}, dest / "jct_cdf.png", _title(result.summary))
    out.print(results_table([result.summary], _title(result.summary)))
    plot = "" if args.no_plot else " and jct_cdf.png"
    out.print(f"wrote {dest}/summary.json, jobs.csv{plot}")
    return 0 if result.summary["errors"] == 0 else 1


def cmd_compare(args: argparse.Namespace) -> int:
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not names:
        raise ValueError("--policies is empty")
    if len(set(names)) != len(names):
        raise ValueError(f"--policies lists a policy twice: {args.policies}")
    specs = [_spec(args, name) for name in names]
    if args.log is not None:
        specs = [replay_cli.logged(s, args.log / f"{s.policy}.eventlog.gz") for s in specs]
    for s in specs:
        s.validate()
    dest = args.out or Path("runs") / f"{_slug(Path(args.trace).name)}-compare"
    results = compare(specs, processes=args.processes)
    for r in results:
        write_run(dest / str(r.summary["policy"]), r.summary, r.jobs)
    summaries = [r.summary for r in results]
    out.print(results_table(summaries, _title(summaries[0])))
    (dest / "compare.json").write_text(json.dumps(summaries, indent=2) + "\n")
    plot = ""
    if not args.no_plot:
        jct_cdf({str(r.summary["policy"]): _jcts(r) for r in results}, dest / "jct_cdf.png",
                _title(summaries[0]))
        plot = ", jct_cdf.png"
    out.print(f"wrote {dest}/compare.json{plot} and {dest}/<policy>/")
    return 0 if all(s["errors"] == 0 for s in summaries) else 1


def _number(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag}: {text.strip()!r} is not a finite number")
    return value


def _rate(flag: str, text: str) -> float:
    value = _number(flag, text)
    if value <= 0:
        raise ValueError(f"{flag}: {text.strip()!r} must be a positive number of jobs per hour")
    return value


def _integer(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag}: {text.strip()!r} is not an integer") from None


def _items(flag: str, text: str, convert: Callable[[str, str], _T]) -> tuple[_T, ...]:
    """A comma-separated option: every item converted, none empty, none twice."""
    items = tuple(convert(flag, part) for part in text.split(","))  # "" fails to convert
    if len(set(items)) != len(items):
        raise ValueError(f"{flag} lists a value twice: {text}")
    return items


def _name(_: str, text: str) -> str:
    if not text.strip():
        raise ValueError("--policies has an empty name")
    return text.strip()


def _window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    if not sep:
        raise ValueError(f"--window: expected START:END job IDs, got {text!r}")
    return _integer("--window", start), _integer("--window", end)


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.processes < 0:
        raise ValueError(f"--processes must be 0 (one per CPU) or more, got {args.processes}")
    sweep = Sweep(
        policies=_items("--policies", args.policies, _name),
        rates=_items("--rates", args.rates, _rate),
        seeds=_items("--seeds", args.seeds, _integer),
        cluster=args.cluster, jobs=args.jobs, window=_window(args.window),
        gpus_per_server=args.gpus_per_server, throughputs=args.throughputs,
        distribution=args.distribution, multi_gpu=args.multi_gpu,
        multi_priority=args.multi_priority, round_s=args.round_s, log_level=args.log_level,
        run_to_completion=args.run_to_completion,
    )
    sweep.validate()
    dest = args.out or Path("runs") / f"sweep-{_slug(Path(args.cluster).name).replace(':', '-')}"
    rows = run_sweep(sweep, args.processes, dest / "traces" if args.save_traces else None)
    dest.mkdir(parents=True, exist_ok=True)
    write_csv(rows, dest / "sweep.csv")
    write_json(rows, sweep, args.invocation, dest / "sweep.json")
    start, end = sweep.job_window
    seeds = ",".join(str(s) for s in sweep.seeds)
    title = (f"{args.cluster}, {sweep.distribution} jobs: window {start}..{end - 1} of "
             f"{sweep.jobs}, seed{'s' if len(sweep.seeds) > 1 else ''} {seeds}")
    jct = curves(rows)
    jct_vs_load({p: {r: [v for v in vs if v is not None] for r, vs in by_rate.items()}
                 for p, by_rate in jct.items()}, dest / "jct_vs_load.png", title)
    out.print(sweep_table(jct, title))
    for r in rows:
        if r.errors or r.window_unfinished:
            err.print(f"[yellow]warning:[/yellow] {r.policy} at {r.rate_jobs_per_h:g} jobs/h, "
                      f"seed {r.seed}: {r.window_unfinished} window jobs unfinished, "
                      f"{r.errors} errors", highlight=False)
    out.print(f"wrote {dest}/sweep.csv, sweep.json and jct_vs_load.png"
              + (f", traces in {dest}/traces/" if args.save_traces else ""))
    return 0 if all(not r.errors and not r.window_unfinished for r in rows) else 1


def cmd_gen_trace(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    if args.rate is not None:
        lam = 3600.0 / _rate("--rate", args.rate)
    else:
        lam = _number("--lam", args.lam)
        if lam < 0:
            raise ValueError(f"--lam: {args.lam!r} must be 0 or more seconds")
    if args.generator == "elasticflow":
        return _gen_elasticflow(args, lam)
    for flag in ("gpu_type", "min_ddl", "max_ddl", "best_effort", "max_gpus"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} applies to elasticflow traces only")
    try:
        jobs = generate_gavel_jobs(
            args.jobs, lam, args.seed, multi_gpu=args.multi_gpu,
            multi_priority=args.multi_priority, distribution=args.distribution or "trace",
            throughputs=load_throughputs(args.throughputs) if args.throughputs else None,
        )
    except KeyError as exc:  # a job type the profile lacks
        raise ValueError(f"--throughputs: {exc.args[0]}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_gavel_trace(jobs, args.out)
    out.print(f"wrote {args.out}: {len(jobs)} jobs, mean gap {lam:g} s, Gavel's 10-field format")
    return 0


def _gen_elasticflow(args: argparse.Namespace, lam: float) -> int:
    for flag in ("distribution", "throughputs"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag} applies to gavel traces only")
    min_ddl = 0.5 if args.min_ddl is None else _number("--min-ddl", args.min_ddl)
    max_ddl = 1.5 if args.max_ddl is None else _number("--max-ddl", args.max_ddl)
    if not 0 <= min_ddl <= max_ddl:
        raise ValueError(f"--min-ddl, --max-ddl: need 0 <= {min_ddl:g} <= {max_ddl:g}")
    share = 0.0 if args.best_effort is None else _number("--best-effort", args.best_effort)
    if not 0 <= share <= 1:
        raise ValueError(f"--best-effort: {args.best_effort!r} must be between 0 and 1")
    max_gpus = 16 if args.max_gpus is None else args.max_gpus
    if max_gpus < 1:
        raise ValueError(f"--max-gpus: {max_gpus} must be at least 1")
    gpu_type = args.gpu_type or "A100"
    try:
        jobs = generate_elasticflow_jobs(
            args.jobs, lam, args.seed, gpu_type=gpu_type, max_scale_factor=max_gpus,
            min_ddl=min_ddl, max_ddl=max_ddl, best_effort_percentage=share,
            multi_priority=args.multi_priority,
        )
    except ValueError as exc:  # a template the throughput table lacks (every one for T4)
        raise ValueError(f"--gpu-type {gpu_type}: {exc}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_elasticflow_trace(jobs, args.out)
    out.print(f"wrote {args.out}: {len(jobs)} jobs, mean gap {lam:g} s, ElasticFlow's CSV format")
    return 0


def cmd_policies(_: argparse.Namespace) -> int:
    table = Table(title="Registered policies", title_justify="left")
    for col in ("name", "re-plan", "placement", "description"):
        table.add_column(col)
    for name, cls in sorted(policies.REGISTRY.items()):
        table.add_row(name, cls.replan, cls.placement, cls.description)
    out.print(table)
    return 0


def cmd_traces(_: argparse.Namespace) -> int:
    table = Table(title="Bundled traces", title_justify="left")
    for col in ("name", "format", "description"):
        table.add_column(col)
    for t in bundled_traces():
        table.add_row(t.name, t.format, t.description)
    out.print(table)
    out.print("Clusters: " + ", ".join(bundled_clusters()))
    return 0


def _live(name: str) -> Callable[[argparse.Namespace], int]:
    """A live-cluster command, its module (the NATS client, the services) loaded to run it."""
    def run(args: argparse.Namespace) -> int:
        from loom import live_cli

        return live_cli.COMMANDS[name](args)

    return run


def _from_nats(exc: Exception) -> bool:
    """Whether the NATS client raised this (then its module is loaded)."""
    errors = sys.modules.get("nats.errors")
    return errors is not None and isinstance(exc, errors.Error)


COMMANDS = {"sim": cmd_sim, "compare": cmd_compare, "sweep": cmd_sweep,
            "gen-trace": cmd_gen_trace, "policies": cmd_policies, "traces": cmd_traces,
            "profile": cmd_profile,
            **{name: _live(name) for name in live_args.COMMANDS}, **replay_cli.COMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Recorded with sweep results; not `argv`, which `loom submit --command` stores into.
    args.invocation = list(sys.argv[1:] if argv is None else argv)
    configure(getattr(args, "log_level", "warning"))
    try:
        return COMMANDS[args.command](args)
    except (TraceError, policies.UnknownPolicy, ValueError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    except NatsProblem as exc:  # refused login or permission, TLS failure, no server
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 3
    except Exception as exc:
        if not isinstance(exc, OSError | NatsServerError) and not _from_nats(exc):
            raise
        where = (getattr(args, "nats_url", None) or getattr(args, "url", None)
                 or "the embedded nats-server")
        err.print(f"[red]error:[/red] NATS at {escape(where)}: {type(exc).__name__}: "
                  f"{escape(str(exc))}",
                  highlight=False)
        return 3
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
