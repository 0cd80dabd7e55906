"""The live-cluster commands' arguments, apart from the commands themselves.

Building `loom`'s parser needs these for every command, `loom sim` included; the commands
(`loom.live_cli`) load the NATS client and the live services, which a simulation never uses,
so they are imported only when one of them runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from loom import status_view
from services.runtime.nats_auth import add_arguments as add_nats_auth
from services.runtime.stream_limits import StreamLimits, parse_age, parse_bytes

SERVICES = ("scheduler", "placer", "metrics", "injector", "nodeagent")
COMMANDS = ("serve", "up", "submit", "status", "demo", "cancel", "suspend", "resume", "drain",
            "set-policy")


def url_file() -> Path:
    """Where a running `loom up` leaves its NATS URL for `loom submit`, `status`, ..."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    return base / f"loom-{os.getuid()}" / "nats-url"


def default_url() -> str:
    """`LOOM_NATS_URL`, else the URL of the `loom up` running here, else the standard port."""
    if os.environ.get("LOOM_NATS_URL"):
        return os.environ["LOOM_NATS_URL"]
    try:
        return url_file().read_text().strip() or "nats://127.0.0.1:4222"
    except OSError:
        return "nats://127.0.0.1:4222"


URL_HELP = ("NATS server(s), comma-separated (default: $LOOM_NATS_URL, else the `loom up` "
            "running here, else nats://127.0.0.1:4222)")


class _DeprecatedAlias(argparse._StoreAction):
    """Stores like --nats-url; given under an old name, says which one replaces it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if option_string is not None and option_string != self.option_strings[0]:
            sys.stderr.write(f"warning: {option_string} is deprecated; use "
                             f"{self.option_strings[0]}\n")
        super().__call__(parser, namespace, values, option_string)


def add_connection(parser: argparse.ArgumentParser, *, default: str | None,
                   help: str = URL_HELP, aliases: tuple[str, ...] = ()) -> None:
    """--nats-url and the credential and TLS flags: the same on every live command.
    `aliases` are old names of --nats-url, kept working (CLI flags are a contract)."""
    parser.add_argument("--nats-url", *aliases, dest="nats_url", action=_DeprecatedAlias,
                        default=default,
                        help=help + (f" ({', '.join(aliases)}: deprecated alias)"
                                     if aliases else ""))
    add_nats_auth(parser)


def add_fault_arguments(faults: Any) -> None:
    """The scheduler's node-fault flags: `serve scheduler` reads them, `up` passes them on to
    the scheduler it starts (one list, so the two cannot drift apart)."""
    faults.add_argument("--node-misses", type=int, default=3, metavar="N",
                        help="a node that misses N heartbeats is lost: its jobs are requeued "
                             "(default 3)")
    faults.add_argument("--launch-timeout-s", type=float, default=120.0, metavar="S",
                        help="a launched job its node has not shown started within S seconds "
                             "frees its GPUs and counts as a failed attempt (0: never; "
                             "default 120)")
    faults.add_argument("--retry-attempts", type=int, default=3, metavar="N",
                        help="a job fails for good at its trainer's Nth failure (default 3)")
    faults.add_argument("--retry-base-s", type=float, default=10.0,
                        help="backoff before the first retry (default 10)")
    faults.add_argument("--retry-factor", type=float, default=2.0,
                        help="backoff growth per failure (default 2)")
    faults.add_argument("--retry-cap-s", type=float, default=300.0,
                        help="longest backoff (default 300)")
    faults.add_argument("--retry-jitter", type=float, default=0.0,
                        help="spread each backoff by up to this fraction, seeded by --seed "
                             "(default 0)")


def add_stream_arguments(streams: Any) -> None:
    """The bounds of the cluster's streams (docs/architecture.md, "Bounded storage"):
    whichever service starts first creates them, so `up` passes these to every service."""
    limits = StreamLimits()
    streams.add_argument("--stream-max-bytes", type=_size, default=limits.max_bytes,
                         metavar="SIZE", help="the event stream's limit, e.g. 500M, 8G; "
                         "full, it refuses new messages (default 8G)")
    streams.add_argument("--stream-max-age", type=_age, default=limits.max_age_s,
                         metavar="AGE", help="drop events older than AGE (seconds, or 36h, "
                         "30d, 2w); it must outlast every job, as a restarted scheduler "
                         "rebuilds from the stream (default 0: never)")
    streams.add_argument("--deadletter-max-bytes", type=_size,
                         default=limits.deadletter_max_bytes, metavar="SIZE",
                         help="the dead-letter stream's limit; full, it drops its oldest "
                              "(default 256M)")


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _age(text: str) -> float:
    try:
        return parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_live_commands(sub: Any, positive: Any, overhead: Any) -> None:
    s = sub.add_parser("serve", help="run one service on a live cluster (its own process)")
    s.add_argument("service", choices=SERVICES, help="the service this process runs")
    s.add_argument("--cluster", required=True, help="bundled name, CSV or JSON cluster spec")
    s.add_argument("--gpus-per-server", default="4", help="with GPU counts: GPUs per server")
    s.add_argument("--policy", default="fifo", help="scheduler: policy (default fifo)")
    s.add_argument("--round-s", type=positive, help="scheduler: re-plan every S seconds")
    s.add_argument("--overhead", type=overhead, default="none",
                   help="preemption/restart cost model of simulated nodes (default none)")
    s.add_argument("--node", help="nodeagent: the node id this agent runs")
    s.add_argument("--trace", help="injector: the trace to replay (at its times)")
    s.add_argument("--time-scale", type=positive, default=1.0,
                   help="cluster seconds per wall second, for simulated trainers (default 1)")
    s.add_argument("--origin", type=float,
                   help="Unix time at which cluster time 0 starts (default: use Unix time)")
    s.add_argument("--seed", type=int, default=0,
                   help="scheduler: seed for the policy's and the retries' randomness "
                        "(default 0)")
    s.add_argument("--tenants", help="scheduler: tenants file (TOML or JSON): weight, "
                                     "max_gpus, max_queued per tenant (default: no limits)")
    s.add_argument("--forecast-every", type=float, default=60.0, metavar="S",
                   help="scheduler: forecast waiting jobs' starts (loom status) at most every "
                        "S seconds; negative: never (default 60)")
    s.add_argument("--prometheus-port", type=int,
                   help="metrics: serve Prometheus /metrics on PORT")
    s.add_argument("--prometheus-addr", default="127.0.0.1",
                   help="metrics: address to serve /metrics on (default 127.0.0.1; 0.0.0.0 "
                        "in a container)")
    s.add_argument("--stream-replicas", type=int, default=1,
                   help="copies of the event stream when creating it on a NATS cluster "
                        "(default 1; 3 on a 3-server cluster)")
    s.add_argument("--replica", help="scheduler: this replica's id; replicas elect a leader "
                   "with a lease in JetStream KV, the others stand by")
    s.add_argument("--lease-s", type=positive, default=6.0,
                   help="scheduler replicas: lease duration in seconds (default 6)")
    s.add_argument("--renew-s", type=positive, default=2.0,
                   help="scheduler replicas: renew/poll the lease every S seconds (default 2)")
    agent = s.add_argument_group("nodeagent")
    agent.add_argument("--trainers", choices=("pytorch", "simulated"), default="pytorch",
                       help="pytorch: run real trainer processes (default); simulated: "
                            "progress at the job's iteration time, no processes")
    agent.add_argument("--fake-gpus", type=int,
                       help="K fake GPUs (machines without GPUs) instead of NVML/DCGM")
    agent.add_argument("--gpu-backend", choices=("auto", "dcgm", "nvml"), default="auto",
                       help="GPU discovery and telemetry (default: DCGM if present, else NVML)")
    agent.add_argument("--fake-faults", metavar="FAULTS",
                       default=os.environ.get("LOOM_FAKE_FAULTS", ""),
                       help="with --fake-gpus: failures the fake node pretends, for its health "
                            "checks, e.g. ecc_uncorrectable=1,xid=1:79 (docs/doctor.md; "
                            "default $LOOM_FAKE_FAULTS)")
    agent.add_argument("--no-health-checks", action="store_true",
                       help="run no health checks (`loom doctor`'s) at start-up nor with the "
                            "heartbeats: the scheduler then never cordons this node for them")
    agent.add_argument("--checkpoint-root", type=Path, default=Path("/var/lib/loom/checkpoints"),
                       help="trainers' checkpoints, one directory per job; shared by all "
                            "nodes (default /var/lib/loom/checkpoints)")
    agent.add_argument("--job-user", metavar="USER",
                       help="start trainers as this unprivileged user, which cannot read the "
                            "agent's credentials or files (the agent must run as root; see "
                            "docs/security.md)")
    agent.add_argument("--grace-s", type=positive, default=30.0,
                       help="seconds a stopped trainer gets to checkpoint (default 30)")
    agent.add_argument("--fast-forward", type=int, default=0, metavar="K",
                       help="trainers compute K iterations per launch, then fast-forward")
    agent.add_argument("--advertise-addr", default="127.0.0.1",
                       help="this node's address as other nodes' trainers reach it (rank 0 "
                            "of a job led here listens on it; default 127.0.0.1, one machine)")
    add_fault_arguments(s.add_argument_group("scheduler: node faults"))
    add_stream_arguments(s.add_argument_group("streams (created by the first service)"))
    agent.add_argument("--heartbeat-s", type=positive, default=5.0,
                       help="seconds between heartbeats (default 5)")
    agent.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                       help="trainers also checkpoint every N iterations, so a job lost with "
                            "its node resumes from there (default 0: only when stopped)")
    s.add_argument("--log-level", default="info", help="log level (default info)")
    add_connection(s, default=default_url())

    u = sub.add_parser("up", help="start NATS, the control plane and local node agents")
    where = u.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", help="cluster spec whose nodes will join (no local agents)")
    where.add_argument("--local-nodes", type=int, help="run N node agents here")
    u.add_argument("--gpus-per-node", type=int, default=4, help="with --local-nodes (default 4)")
    u.add_argument("--gpu-type", default="fake", help="with --local-nodes: GPU type name")
    u.add_argument("--policy", default="fifo", help="scheduling policy (default fifo)")
    u.add_argument("--round-s", type=positive, help="re-plan every S seconds")
    u.add_argument("--tenants", help="tenants file for the scheduler (TOML or JSON)")
    u.add_argument("--forecast-every", type=float, default=60.0, metavar="S",
                   help="the scheduler forecasts waiting jobs' starts (loom status) at most "
                        "every S seconds; negative: never (default 60)")
    u.add_argument("--overhead", type=overhead, default="none",
                   help="preemption/restart cost of simulated trainers: none | muri | "
                        "elasticflow | elasticflow-baseline | flat:SECONDS | profile:FILE "
                        "(default none)")
    u.add_argument("--time-scale", type=positive, default=1.0,
                   help="cluster seconds per wall second for simulated trainers (default 1)")
    u.add_argument("--log-level", default="warning",
                   help="log level of `up` and the services it starts (default warning)")
    u.add_argument("--trainers", choices=("pytorch", "simulated"), default="pytorch",
                   help="local node agents run real PyTorch trainers (default) or simulated "
                        "ones (time-scaled)")
    u.add_argument("--prometheus-port", type=int, default=9464,
                   help="Prometheus /metrics of the metrics service (default 9464; 0: off)")
    u.add_argument("--seed", type=int, default=0,
                   help="the scheduler's seed, as `serve --seed` (default 0)")
    add_fault_arguments(u.add_argument_group("scheduler: node faults"))
    add_stream_arguments(u.add_argument_group("streams"))
    add_connection(u, default=None,
                   help="use this NATS server (default: start an embedded one)")

    m = sub.add_parser("submit", help="submit a job to a live cluster; prints its id")
    m.add_argument("--model", required=True,
                   help="what the trainer runs: a workload family or a model name "
                        "(`loom models` lists them); with --command, only a label")
    m.add_argument("--gpus", type=int, required=True,
                   help="GPUs the job needs at once (all or none: gang scheduling)")
    m.add_argument("--iterations", type=int, required=True,
                   help="training iterations; the job is done after this many")
    m.add_argument("--iteration-time", type=positive, default=1.0,
                   help="seconds per iteration, used until the trainer reports (default 1)")
    m.add_argument("--deadline-in", type=positive, help="deadline, seconds from now")
    m.add_argument("--tenant", default="default",
                   help="who the job is for: its quota and fair share (default: default)")
    m.add_argument("--job-id", help="default: a new random id")
    add_connection(m, default=default_url())
    run = m.add_argument_group("your own command (docs/sdk.md)")
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                     help="extra environment for the command (repeatable)")
    run.add_argument("--cwd", help="the command's working directory (absolute)")
    run.add_argument("--progress-regex", help="read progress from stdout lines matching this "
                     "(named groups iteration, loss); default: LOOM_PROGRESS iteration=N ...")
    run.add_argument("--command", dest="job_command", nargs=argparse.REMAINDER, metavar="ARGV",
                     help="run this per GPU instead of Loom's trainer; it takes the rest of "
                          "the line, so give it last")

    d = sub.add_parser("demo", help="a local cluster running six real PyTorch jobs, with "
                                    "preemption and resume, then a summary")
    d.add_argument("--out", type=Path, help="also write DIR/summary.json")
    d.add_argument("--timeout", type=positive, default=600.0,
                   help="give up (exit 1) if the jobs have not all finished after this many "
                        "seconds (default 600; about 50 s on a quiet 2-core machine)")
    d.add_argument("--log-level", default="warning",
                   help="log level of the demo's services, in its log file (default warning)")

    for name, target, what in (("cancel", "job", "stop a job for good (its state: failed)"),
                               ("suspend", "job", "stop a job and hold it until resumed"),
                               ("resume", "job", "give a suspended job back to the policy"),
                               ("drain", "node", "no new work on a node (running jobs go on)"),
                               ("set-policy", "policy", "switch the scheduling policy now")):
        op = sub.add_parser(name, help=what)
        op.add_argument(target, help=f"the {target}")
        if name == "drain":
            op.add_argument("--undo", action="store_true", help="take new work again")
        add_connection(op, default=default_url())

    st = sub.add_parser("status", help="jobs of a live cluster: state, reason, GPUs, progress")
    st.add_argument("--json", action="store_true", help="print the scheduler's state as JSON")
    status_view.add_arguments(st)
    add_connection(st, default=default_url())
