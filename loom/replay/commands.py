"""`loom replay` and `loom log export`, and `--log` for `loom sim` / `loom compare`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loom.eventlog import RunInfo, read_log
from loom.live_args import add_connection, default_url
from loom.progress import RunProgress, choose_mode
from loom.replay.cores import fresh_cores
from loom.replay.engine import check_digest, check_payloads, replay
from loom.replay.whatif import arrivals, comparison_rows, recorded_summary, what_if
from loom.runs import RunSpec
from loom.simulate import SimConfig
from loom.versions import running_versions, versions_note
from schemas import subjects
from schemas.tenants import load_tenants
from services.runtime.nats_auth import NatsAuth
from traces import load_cluster

out = Console(width=None if sys.stdout.isatty() else 160, highlight=False)


@dataclasses.dataclass(frozen=True)
class LoggedRunSpec(RunSpec):
    """A run that also writes its event log (a RunSpec, so it crosses process boundaries)."""

    log: Path | None = None

    def config(self) -> SimConfig:
        return dataclasses.replace(super().config(), log=self.log)


def logged(spec: RunSpec, log: Path) -> RunSpec:
    """`spec` that also writes its event log to `log` (checked writable now, not after the
    run)."""
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab"):
            pass
    except OSError as exc:
        raise ValueError(f"--log {log}: cannot write there ({exc.strerror or exc})") from None
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return LoggedRunSpec(**fields, log=log)


def add_commands(sub: Any, positive: Callable[[str], float],
                 overhead: Callable[[str], str]) -> None:
    rp = sub.add_parser(
        "replay", help="check a run's event log against fresh cores, or what-if another policy",
        description="Feed the recorded inputs of the scheduler and placer to fresh cores and "
                    "check every recorded decision; print OK with the decision digest, or the "
                    "first divergent decision with its inputs (exit 1). With --policy, "
                    "simulate the same arrivals under another policy and compare. A log "
                    "that cannot be read (damaged, cut short, not a log) exits 2, naming "
                    "the record.")
    rp.add_argument("log", type=Path, help="event log file (loom sim --log, loom log export)")
    rp.add_argument("--policy", help="what-if: simulate the log's arrivals under this policy")
    rp.add_argument("--round-s", type=positive,
                    help="what-if: re-plan every S seconds (default: as recorded)")
    rp.add_argument("--quiet", action="store_true",
                    help="no progress (a bar on a terminal, else a line about every 10 s)")

    lg = sub.add_parser("log", help="event logs").add_subparsers(dest="log_command",
                                                                 required=True)
    ex = lg.add_parser("export", help="write a live JetStream stream as an event log file",
                       description="Read the whole stream in order and write it as an event "
                                   "log. A stream does not record how its scheduler was "
                                   "configured: give --policy, --cluster and the rest as the "
                                   "scheduler ran, so the log can be replayed.")
    ex.add_argument("--out", type=Path, required=True, help="file to write (.gz: gzipped)")
    add_connection(ex, default=default_url(), aliases=("--url",))
    ex.add_argument("--stream", default=subjects.STREAM, help="stream (default LOOM)")
    ex.add_argument("--policy", help="the scheduler's policy (for replay)")
    ex.add_argument("--cluster", help="the cluster spec the services ran with (for replay)")
    ex.add_argument("--gpus-per-server", default="4", help="with GPU counts: GPUs per server")
    ex.add_argument("--round-s", type=positive, help="the scheduler's --round-s")
    ex.add_argument("--overhead", type=overhead, default="none",
                    help="the scheduler's --overhead")
    ex.add_argument("--seed", type=int, default=0, help="the scheduler's --seed")
    ex.add_argument("--tenants", type=Path, help="the scheduler's --tenants file (TOML or JSON)")


def cmd_replay(args: argparse.Namespace) -> int:
    log = read_log(args.log)
    check_payloads(log)
    if args.policy is not None:
        return _what_if(log, args.policy, args.round_s)
    if args.round_s is not None:
        raise ValueError("--round-s applies to a what-if replay (--policy) only")
    with RunProgress("replay", choose_mode(args.quiet), unit="messages") as shown:
        result = replay(log, fresh_cores(log),
                        progress=lambda done, total, at: shown(done, total, at, done, done))
    check_digest(log, result)
    checked = ", ".join(f"{n} {k:,} decisions from {result.inputs[n]:,} inputs"
                        for n, k in result.decisions.items())
    if result.divergence is not None:
        out.print(escape(result.divergence.render()))
        for line in versions_note(log.versions, running_versions()):
            out.print(escape(line))
        return 1
    mode = "exactly" if log.source == "sim" else "structurally (live log: floats not compared)"
    skipped = (f" ({result.undecodable} undecodable inputs skipped, as the bus dead-lettered "
               "them)" if result.undecodable else "")
    cut = "".join(f"; {k:,} {n} decisions after the log's end (a live log ends where it was "
                  "cut: replies to its last inputs may not have been stored)"
                  for n, k in result.cut_off.items())
    out.print(f"OK {args.log}: {len(log.records):,} messages; {checked}; all match {mode}"
              f"{skipped}{cut}")
    out.print(f"decision_digest {result.digest}")
    return 0


def _what_if(log: Any, policy: str, round_s: float | None) -> int:
    recorded = recorded_summary(log)
    result = asyncio.run(what_if(log, policy, round_s))
    cluster = (log.run.cluster or {}).get("name")
    out.print(f"what-if on {log.path.name}: the {len(arrivals(log))} arrivals of "
              f"{log.run.trace} on {cluster}")
    table = Table()
    table.add_column("metric")
    table.add_column(f"recorded ({recorded['policy']})", justify="right")
    table.add_column(f"what-if ({policy})", justify="right")
    for row in comparison_rows(recorded, result.summary):
        table.add_row(*row)
    out.print(table)
    return 0 if result.summary["errors"] == 0 else 1


def cmd_log(args: argparse.Namespace) -> int:
    cluster = None
    if args.cluster is not None:
        cluster = load_cluster(args.cluster, args.gpus_per_server).model_dump(mode="json")
    tenants = None if args.tenants is None else load_tenants(args.tenants)
    run = RunInfo(policy=args.policy, cluster=cluster, seed=args.seed, overhead=args.overhead,
                  round_s=args.round_s, trace=f"stream {args.stream}", run_id="live",
                  tenants=None if tenants is None else tenants.model_dump(mode="json"))
    from loom.replay.export import export_stream  # the NATS client: only to export

    n = asyncio.run(export_stream(args.nats_url, args.stream, args.out, run,
                                  auth=NatsAuth.from_args(args)))
    out.print(f"wrote {args.out}: {n:,} messages from stream {args.stream}")
    return 0


COMMANDS = {"replay": cmd_replay, "log": cmd_log}
