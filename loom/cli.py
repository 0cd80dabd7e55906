"""`loom`: the single command-line entry point.

    loom sim      run one policy on a trace (memory bus, or NATS JetStream with --bus nats)
    loom compare  run several policies on the same trace, in parallel, and print one table
    loom policies list the registered policies
    loom traces   list the bundled traces and clusters
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import nats.errors
from rich.console import Console
from rich.table import Table

import policies
from loom.plots import jct_cdf
from loom.report import results_table, write_run
from loom.runs import RunSpec, compare, run_one
from loom.simulate import SimResult
from services.nodeagent.overhead import parse_overhead
from services.placer.core import SCHEMES
from services.runtime.logging import configure
from services.runtime.natsserver import NatsServerError
from traces import TraceError, bundled_clusters, bundled_traces

# Wide enough for the results table when piped to a file or CI log.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


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
    p.add_argument("--overhead", type=_overhead,
                   help="none | muri | elasticflow | flat:SECONDS (default: the trace's origin)")
    p.add_argument("--placement", choices=SCHEMES,
                   help="placement scheme (default: the policy's); yarn = the research "
                        "simulators' first-fit re-pack, for compatibility runs")
    p.add_argument("--seed", type=int, default=0, help="seed for any randomness (default 0)")
    p.add_argument("--log-level", default="warning", help="service log level (default warning)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loom", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("sim", help="simulate one policy on a trace")
    _add_run_options(sim)
    sim.add_argument("--policy", required=True, help="a registered policy (see `loom policies`)")
    sim.add_argument("--out", type=Path, help="output directory (default runs/<trace>-<policy>)")

    cmp_ = sub.add_parser("compare", help="simulate several policies on one trace")
    _add_run_options(cmp_)
    cmp_.add_argument("--policies", required=True, help="comma-separated, e.g. srtf,tiresias")
    cmp_.add_argument("--out", type=Path, help="output directory (default runs/<trace>-compare)")
    cmp_.add_argument("--processes", type=int, default=0,
                      help="parallel processes (default: one per policy, up to the CPU count)")

    sub.add_parser("policies", help="list registered policies")
    sub.add_parser("traces", help="list bundled traces and clusters")
    return parser


def _slug(text: str) -> str:
    return text.replace("/", "_").replace("\\", "_").removesuffix(".csv")


def _spec(args: argparse.Namespace, policy: str) -> RunSpec:
    return RunSpec(
        trace=args.trace, cluster=args.cluster, policy=policy, bus=args.bus,
        nats_url=args.nats_url, round_s=args.round_s, overhead=args.overhead,
        placement=args.placement, seed=args.seed,
        log_level=args.log_level, gpus_per_server=args.gpus_per_server,
        throughputs=args.throughputs,
    )


def _jcts(result: SimResult) -> list[float]:
    return [j.jct_s for j in result.jobs if j.jct_s is not None]


def _title(summary: dict[str, object]) -> str:
    return f"{summary['trace']} on {summary['cluster']} ({summary['bus']} bus)"


def cmd_sim(args: argparse.Namespace) -> int:
    spec = _spec(args, args.policy)
    spec.validate()
    dest = args.out or Path("runs") / f"{_slug(Path(args.trace).name)}-{args.policy}"
    result = run_one(spec, progress=True)
    write_run(dest, result.summary, result.jobs)
    jct_cdf({args.policy: _jcts(result)}, dest / "jct_cdf.png", _title(result.summary))
    out.print(results_table([result.summary], _title(result.summary)))
    out.print(f"wrote {dest}/summary.json, jobs.csv and jct_cdf.png")
    return 0 if result.summary["errors"] == 0 else 1


def cmd_compare(args: argparse.Namespace) -> int:
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not names:
        raise ValueError("--policies is empty")
    if len(set(names)) != len(names):
        raise ValueError(f"--policies lists a policy twice: {args.policies}")
    specs = [_spec(args, name) for name in names]
    for s in specs:
        s.validate()
    dest = args.out or Path("runs") / f"{_slug(Path(args.trace).name)}-compare"
    results = compare(specs, processes=args.processes)
    for r in results:
        write_run(dest / str(r.summary["policy"]), r.summary, r.jobs)
    summaries = [r.summary for r in results]
    out.print(results_table(summaries, _title(summaries[0])))
    (dest / "compare.json").write_text(json.dumps(summaries, indent=2) + "\n")
    jct_cdf({str(r.summary["policy"]): _jcts(r) for r in results}, dest / "jct_cdf.png",
            _title(summaries[0]))
    out.print(f"wrote {dest}/compare.json, jct_cdf.png and {dest}/<policy>/")
    return 0 if all(s["errors"] == 0 for s in summaries) else 1


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


COMMANDS = {"sim": cmd_sim, "compare": cmd_compare, "policies": cmd_policies,
            "traces": cmd_traces}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(getattr(args, "log_level", "warning"))
    try:
        return COMMANDS[args.command](args)
    except (TraceError, policies.UnknownPolicy, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    except (OSError, NatsServerError, nats.errors.Error) as exc:
        where = getattr(args, "nats_url", None) or "the embedded nats-server"
        err.print(f"[red]error:[/red] NATS at {where}: {type(exc).__name__}: {exc}",
                  highlight=False)
        return 3
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
