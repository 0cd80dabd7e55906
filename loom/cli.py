"""`loom`: the single command-line entry point.

    loom sim        run one policy on a trace (memory bus, or NATS JetStream with --bus nats)
    loom compare    run several policies on the same trace, in parallel, and print one table
    loom sweep      avg JCT against input job rate, policies × rates × seeds (Gavel's method)
    loom gen-trace  write a synthetic trace drawn as Gavel's or ElasticFlow's generator draws it
    loom gen-tenants write a tenants file from a production trace (Helios VC quotas, GPU time)
    loom policies   list the registered policies
    loom traces     list the bundled traces and clusters, and the production trace formats
    loom models     list the models a job may name, with their throughput profiles
    loom replay     check an event log against fresh cores, or what-if another policy
    loom log export write a live JetStream stream as an event log file
    loom profile    measure workloads with the real trainer: throughput tables, stage times,
                    restart/resize overheads (for `loom sim --profile`)

  live cluster:
    loom up         start NATS, the control plane and local node agents
    loom serve      run one service (scheduler, placer, metrics, injector, nodeagent)
    loom submit     submit a job and print its id
    loom status     jobs with state, reason, queue position, GPUs, progress and ETA
    loom queues     queues: quotas, GPUs used, borrowed and lent, waiting jobs and why
    loom doctor     check this node can run Loom's jobs (driver, GPUs, CUDA, NCCL, MPS,
                    checkpoints, NATS, clock): exit 0 pass, 1 warn, 2 fail
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rich.markup import escape
from rich.table import Table

import policies
from loom import doctor_cli, live_args, models_cli, queues_cli, sim_cli, synth_cli, trace_cli
from loom.cli_common import err, out, overhead, positive
from loom.profile import add_profile_command, cmd_profile
from loom.replay import commands as replay_cli
from services.runtime.logging import configure
from services.runtime.nats_errors import NatsProblem
from services.runtime.natsserver import NatsServerError
from traces import TraceError, bundled_clusters, bundled_traces


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; each group adds its own, in the order `loom --help` lists."""
    parser = argparse.ArgumentParser(prog="loom", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sim_cli.add_commands(sub)  # sim, compare
    synth_cli.add_commands(sub)  # sweep, gen-trace
    trace_cli.add_commands(sub)  # gen-tenants
    add_profile_command(sub)
    sub.add_parser("policies", help="list registered policies")
    sub.add_parser("traces", help="list bundled traces and clusters, and the production "
                                  "trace formats and clusters with their sources")
    models_cli.add_command(sub)
    live_args.add_live_commands(sub, positive, overhead)
    queues_cli.add_command(sub)
    replay_cli.add_commands(sub, positive, overhead)
    doctor_cli.add_command(sub)
    return parser


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
    out.print(trace_cli.formats_table())
    out.print(trace_cli.clusters_table())
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


COMMANDS = {**sim_cli.COMMANDS, **synth_cli.COMMANDS, **trace_cli.COMMANDS,
            "policies": cmd_policies,
            "traces": cmd_traces, "profile": cmd_profile, **models_cli.COMMANDS,
            **{name: _live(name) for name in live_args.COMMANDS}, **replay_cli.COMMANDS,
            **doctor_cli.COMMANDS, **queues_cli.COMMANDS}


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
