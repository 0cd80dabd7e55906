"""The live-cluster commands: `loom serve`, `loom up`, `loom submit`, `loom status`."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import secrets
import socket
import tempfile
from pathlib import Path
from typing import Any

import nats
from rich.console import Console
from rich.table import Table

import policies
from loom.serve import SERVICES, ServeOptions, UpOptions, control_subject, default_url, serve, up
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import encode
from schemas.events import OperatorCommand, envelope
from schemas.job import SubmitJob
from schemas.tenants import load_tenants
from services.runtime.bus import MSG_ID
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_auth import add_arguments as add_nats_auth
from services.runtime.nats_live import ensure_stream, server_list
from services.scheduler.liveness import LivenessConfig, RetryPolicy
from traces import load_cluster, load_trace

URL_HELP = ("NATS server(s), comma-separated (default: $LOOM_NATS_URL, else the `loom up` "
            "running here, else nats://127.0.0.1:4222)")


def add_live_commands(sub: Any, positive: Any, overhead: Any) -> None:
    s = sub.add_parser("serve", help="run one service on a live cluster (its own process)")
    s.add_argument("service", choices=SERVICES)
    s.add_argument("--nats-url", default=default_url(), help=URL_HELP)
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
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--tenants", help="scheduler: tenants file (TOML or JSON): weight, "
                                     "max_gpus, max_queued per tenant (default: no limits)")
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
    agent.add_argument("--checkpoint-root", type=Path, default=Path("/var/lib/loom/checkpoints"),
                       help="trainers' checkpoints, one directory per job; shared by all "
                            "nodes (default /var/lib/loom/checkpoints)")
    agent.add_argument("--grace-s", type=positive, default=30.0,
                       help="seconds a stopped trainer gets to checkpoint (default 30)")
    agent.add_argument("--fast-forward", type=int, default=0, metavar="K",
                       help="trainers compute K iterations per launch, then fast-forward")
    agent.add_argument("--advertise-addr", default="127.0.0.1",
                       help="this node's address as other nodes' trainers reach it (rank 0 "
                            "of a job led here listens on it; default 127.0.0.1, one machine)")
    faults = s.add_argument_group("scheduler: node faults")
    faults.add_argument("--node-misses", type=int, default=3, metavar="N",
                        help="a node that misses N heartbeats is lost: its jobs are requeued "
                             "(default 3)")
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
    agent.add_argument("--heartbeat-s", type=positive, default=5.0,
                       help="seconds between heartbeats (default 5)")
    agent.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                       help="trainers also checkpoint every N iterations, so a job lost with "
                            "its node resumes from there (default 0: only when stopped)")
    s.add_argument("--log-level", default="info", help="log level (default info)")
    add_nats_auth(s)

    u = sub.add_parser("up", help="start NATS, the control plane and local node agents")
    u.add_argument("--nats-url", help="use this NATS server (default: start an embedded one)")
    where = u.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", help="cluster spec whose nodes will join (no local agents)")
    where.add_argument("--local-nodes", type=int, help="run N node agents here")
    u.add_argument("--gpus-per-node", type=int, default=4, help="with --local-nodes (default 4)")
    u.add_argument("--gpu-type", default="fake", help="with --local-nodes: GPU type name")
    u.add_argument("--policy", default="fifo", help="scheduling policy (default fifo)")
    u.add_argument("--round-s", type=positive, help="re-plan every S seconds")
    u.add_argument("--tenants", help="tenants file for the scheduler (TOML or JSON)")
    u.add_argument("--overhead", type=overhead, default="none")
    u.add_argument("--time-scale", type=positive, default=1.0,
                   help="cluster seconds per wall second for simulated trainers (default 1)")
    u.add_argument("--log-level", default="warning")
    u.add_argument("--trainers", choices=("pytorch", "simulated"), default="pytorch",
                   help="local node agents run real PyTorch trainers (default) or simulated "
                        "ones (time-scaled)")
    u.add_argument("--prometheus-port", type=int, default=9464,
                   help="Prometheus /metrics of the metrics service (default 9464; 0: off)")
    add_nats_auth(u)

    m = sub.add_parser("submit", help="submit a job to a live cluster; prints its id")
    m.add_argument("--nats-url", default=default_url(), help=URL_HELP)
    m.add_argument("--model", required=True)
    m.add_argument("--gpus", type=int, required=True)
    m.add_argument("--iterations", type=int, required=True)
    m.add_argument("--iteration-time", type=positive, default=1.0,
                   help="seconds per iteration, used until the trainer reports (default 1)")
    m.add_argument("--deadline-in", type=positive, help="deadline, seconds from now")
    m.add_argument("--tenant", default="default")
    m.add_argument("--job-id", help="default: a new random id")
    add_nats_auth(m)
    run = m.add_argument_group("your own command (docs/sdk.md)")
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                     help="extra environment for the command (repeatable)")
    run.add_argument("--cwd", help="the command's working directory (absolute)")
    run.add_argument("--progress-regex", help="read progress from stdout lines matching this "
                     "(named groups iteration, loss); default: LOOM_PROGRESS iteration=N ...")
    run.add_argument("--command", dest="argv", nargs=argparse.REMAINDER, metavar="ARGV",
                     help="run this per GPU instead of Loom's trainer; it takes the rest of "
                          "the line, so give it last")

    d = sub.add_parser("demo", help="a local cluster running six real PyTorch jobs, with "
                                    "preemption and resume, then a summary")
    d.add_argument("--out", type=Path, help="also write DIR/summary.json")
    d.add_argument("--log-level", default="warning")

    for name, target, what in (("cancel", "job", "stop a job for good (its state: failed)"),
                               ("suspend", "job", "stop a job and hold it until resumed"),
                               ("resume", "job", "give a suspended job back to the policy"),
                               ("drain", "node", "no new work on a node (running jobs go on)"),
                               ("set-policy", "policy", "switch the scheduling policy now")):
        op = sub.add_parser(name, help=what)
        op.add_argument(target, help=f"the {target}")
        op.add_argument("--nats-url", default=default_url(), help=URL_HELP)
        if name == "drain":
            op.add_argument("--undo", action="store_true", help="take new work again")
        add_nats_auth(op)

    st = sub.add_parser("status", help="jobs of a live cluster: state, reason, GPUs, progress")
    st.add_argument("--nats-url", default=default_url(), help=URL_HELP)
    st.add_argument("--json", action="store_true", help="print the scheduler's state as JSON")
    add_nats_auth(st)


def cmd_serve(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster, args.gpus_per_server)
    jobs = load_trace(args.trace).jobs if args.trace else ()
    if args.service == "injector" and not jobs:
        raise ValueError("injector needs --trace")
    opts = ServeOptions(args.service, args.nats_url, cluster, policy=args.policy,
                        round_s=args.round_s, overhead=args.overhead, node=args.node,
                        jobs=jobs, time_scale=args.time_scale, origin=args.origin,
                        seed=args.seed, prometheus_port=args.prometheus_port,
                        trainers=args.trainers, fake_gpus=args.fake_gpus,
                        gpu_backend=args.gpu_backend, checkpoint_root=args.checkpoint_root,
                        grace_s=args.grace_s, fast_forward=args.fast_forward,
                        prometheus_addr=args.prometheus_addr,
                        advertise_addr=args.advertise_addr,
                        stream_replicas=args.stream_replicas, auth=NatsAuth.from_args(args),
                        heartbeat_s=args.heartbeat_s,
                        checkpoint_every=args.checkpoint_every,
                        liveness=LivenessConfig(misses=args.node_misses),
                        retry=RetryPolicy(max_attempts=args.retry_attempts,
                                          base_s=args.retry_base_s, factor=args.retry_factor,
                                          cap_s=args.retry_cap_s, jitter=args.retry_jitter,
                                          seed=args.seed),
                        tenants=load_tenants(args.tenants) if args.tenants else None,
                        replica=args.replica, lease_s=args.lease_s, renew_s=args.renew_s)
    return asyncio.run(serve(opts))


def cmd_up(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="loom-up-") as tmp:
        if args.local_nodes is not None:
            if args.local_nodes < 1 or args.gpus_per_node < 1:
                raise ValueError("--local-nodes and --gpus-per-node must be at least 1")
            cluster = ClusterSpec.uniform(1, args.local_nodes, args.gpus_per_node,
                                          gpu_type=args.gpu_type)
            spec = Path(tmp) / "local-cluster.json"
            spec.write_text(cluster.model_dump_json())
            cluster_arg = str(spec)
        else:
            cluster, cluster_arg = load_cluster(args.cluster), args.cluster
        opts = UpOptions(cluster, cluster_arg, nats_url=args.nats_url, policy=args.policy,
                         round_s=args.round_s, overhead=args.overhead,
                         time_scale=args.time_scale, local_nodes=args.local_nodes is not None,
                         log_level=args.log_level, prometheus_port=args.prometheus_port or None,
                         trainers=args.trainers, gpus_per_node=args.gpus_per_node,
                         state_dir=Path(tmp), auth=NatsAuth.from_args(args),
                         tenants=_checked_tenants(args.tenants))
        return asyncio.run(up(opts))


def _checked_tenants(path: str | None) -> str | None:
    """Fail in `loom up` itself on a bad tenants file; the scheduler process reads it again."""
    if path is None:
        return None
    load_tenants(path)
    return str(Path(path).resolve())


def cmd_submit(args: argparse.Namespace) -> int:
    job_id = args.job_id or f"job-{secrets.token_hex(4)}"
    print(asyncio.run(_submit(args, job_id)))
    return 0


async def _submit(args: argparse.Namespace, job_id: str) -> str:
    body: dict[str, Any] = {"job_id": job_id, "tenant": args.tenant, "model": args.model,
                            "gpus": args.gpus, "iterations": args.iterations,
                            "iteration_time_s": args.iteration_time}
    if args.argv:
        body["command"] = args.argv
        if args.env:
            body["env"] = dict(_pair(e) for e in args.env)
        for key in ("cwd", "progress_regex"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
    elif args.env or args.cwd or args.progress_regex:
        raise ValueError("--env, --cwd and --progress-regex need --command")
    SubmitJob.model_validate(body)  # a bad job is refused here, not dead-lettered there
    nc = await nats.connect(servers=server_list(args.nats_url), connect_timeout=5,
                            max_reconnect_attempts=0,
                            **NatsAuth.from_args(args).connect_kwargs())
    try:
        if args.deadline_in is not None:
            state = await _state(nc)
            body["deadline_s"] = state["now"] + args.deadline_in
        js = nc.jetstream()
        await ensure_stream(js)
        # The same bytes `nats pub loom.jobs.submit '<json>'` sends, with the id as Nats-Msg-Id
        # so a retried submit is dropped as a duplicate.
        await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                         headers={MSG_ID: f"submit.{job_id}"})
        return job_id
    finally:
        await nc.close()


def _pair(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq:
        raise ValueError(f"--env {text!r}: use NAME=VALUE")
    return name, value


async def _state(nc: Any, service: str = "scheduler") -> dict[str, Any]:
    try:
        reply = await nc.request(control_subject(service), b"", timeout=5)
    except nats.errors.NoRespondersError:
        raise ValueError(f"no {service} is running on this NATS server") from None
    state: dict[str, Any] = json.loads(reply.data)
    return state


def cmd_operator(args: argparse.Namespace) -> int:
    command = "undrain" if args.command == "drain" and args.undo else args.command
    print(asyncio.run(_operate(args.nats_url, command, getattr(args, "job", None),
                               getattr(args, "node", None), getattr(args, "policy", None),
                               NatsAuth.from_args(args))))
    return 0


async def _operate(url: str, command: str, job: str | None, node: str | None,
                   policy: str | None, auth: NatsAuth | None = None) -> str:
    """Check the target against the scheduler's state, send the command, await its effect."""
    nc = await nats.connect(servers=server_list(url), connect_timeout=5,
                            max_reconnect_attempts=0, **(auth or NatsAuth()).connect_kwargs())
    try:
        state = await _state(nc)
        jobs = {j["job_id"]: j for j in state["jobs"]}
        if job is not None and (job not in jobs or jobs[job]["state"] in TERMINAL):
            raise ValueError(f"{command}: no active job {job!r}")
        if node is not None and node not in state["nodes"]:
            raise ValueError(f"{command}: no node {node!r} (nodes: {', '.join(state['nodes'])})")
        if policy is not None:
            policies.make(policy)  # UnknownPolicy names the registered ones
        cmd = OperatorCommand(command=command,
                              job_id=job, node_id=node, policy=policy,
                              requested_by=f"{getpass.getuser()}@{socket.gethostname()}")
        env = envelope(cmd, event_id=f"ops.{secrets.token_hex(8)}", occurred_at=state["now"],
                       producer="loom-cli", causation_id=None)
        js = nc.jetstream()
        await js.publish(subjects.OPERATOR, encode(env), headers={MSG_ID: env.event_id})
        for _ in range(50):  # the scheduler acts at once; confirm from its state
            state = await _state(nc)
            if _applied(state, command, job, node, policy):
                return f"{command} {job or node or policy}: done"
            await asyncio.sleep(0.2)
        return f"{command} {job or node or policy}: sent (not confirmed yet; see loom status)"
    finally:
        await nc.close()


TERMINAL = ("finished", "failed", "rejected")


def _applied(state: dict[str, Any], command: str, job: str | None, node: str | None,
             policy: str | None) -> bool:
    if command == "cancel":
        return any(j["job_id"] == job and j["state"] == "failed" for j in state["jobs"])
    if command in ("suspend", "resume"):
        return (job in state["suspended"]) == (command == "suspend")
    if command in ("drain", "undrain"):
        return (node in state["drained"]) == (command == "drain")
    return bool(state["policy"] == policy)


def cmd_status(args: argparse.Namespace) -> int:
    state = asyncio.run(_status(args.nats_url, NatsAuth.from_args(args)))
    if args.json:
        print(json.dumps(state, indent=2))
        return 0
    now = state["now"]
    table = Table(title=f"{len(state['jobs'])} jobs · policy {state['policy']} · "
                        f"cycle {state['cycle']} · t={now:,.0f} s")
    for col in ("job", "tenant", "model", "state", "GPUs", "progress", "ETA", "pos", "reason"):
        table.add_column(col, justify="right" if col in ("GPUs", "progress", "ETA", "pos")
                         else "left")
    for j in state["jobs"]:
        eta = "" if j["eta"] is None else f"{j['eta'] - now:,.0f} s"
        pos = "" if j["queue_position"] is None else str(j["queue_position"])
        table.add_row(j["job_id"], j["tenant"], j["model"], j["state"], str(j["gpus"]),
                      f"{100 * j['done'] / j['iterations']:.0f}%", eta, pos, j["reason"])
    Console(width=160).print(table)
    return 0


async def _status(url: str, auth: NatsAuth | None = None) -> dict[str, Any]:
    nc = await nats.connect(servers=server_list(url), connect_timeout=5,
                            max_reconnect_attempts=0, **(auth or NatsAuth()).connect_kwargs())
    try:
        return await _state(nc)
    finally:
        await nc.close()


def cmd_demo(args: argparse.Namespace) -> int:
    from loom.demo import run_demo  # its imports serve the demo alone

    return asyncio.run(run_demo(args.out, Console(width=120)))


COMMANDS = {"serve": cmd_serve, "up": cmd_up, "submit": cmd_submit, "status": cmd_status,
            "demo": cmd_demo, "cancel": cmd_operator, "suspend": cmd_operator,
            "resume": cmd_operator, "drain": cmd_operator, "set-policy": cmd_operator}
