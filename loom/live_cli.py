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
from loom.demo import run_demo
from loom.serve import SERVICES, ServeOptions, UpOptions, control_subject, default_url, serve, up
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import encode
from schemas.events import OperatorCommand, envelope
from services.runtime.bus import MSG_ID
from services.runtime.nats_live import ensure_stream, server_list
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
    s.add_argument("--prometheus-port", type=int,
                   help="metrics: serve Prometheus /metrics on PORT")
    s.add_argument("--prometheus-addr", default="127.0.0.1",
                   help="metrics: address to serve /metrics on (default 127.0.0.1; 0.0.0.0 "
                        "in a container)")
    s.add_argument("--stream-replicas", type=int, default=1,
                   help="copies of the event stream when creating it on a NATS cluster "
                        "(default 1; 3 on a 3-server cluster)")
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
    s.add_argument("--log-level", default="info", help="log level (default info)")

    u = sub.add_parser("up", help="start NATS, the control plane and local node agents")
    u.add_argument("--nats-url", help="use this NATS server (default: start an embedded one)")
    where = u.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", help="cluster spec whose nodes will join (no local agents)")
    where.add_argument("--local-nodes", type=int, help="run N node agents here")
    u.add_argument("--gpus-per-node", type=int, default=4, help="with --local-nodes (default 4)")
    u.add_argument("--gpu-type", default="fake", help="with --local-nodes: GPU type name")
    u.add_argument("--policy", default="fifo", help="scheduling policy (default fifo)")
    u.add_argument("--round-s", type=positive, help="re-plan every S seconds")
    u.add_argument("--overhead", type=overhead, default="none")
    u.add_argument("--time-scale", type=positive, default=1.0,
                   help="cluster seconds per wall second for simulated trainers (default 1)")
    u.add_argument("--log-level", default="warning")
    u.add_argument("--trainers", choices=("pytorch", "simulated"), default="pytorch",
                   help="local node agents run real PyTorch trainers (default) or simulated "
                        "ones (time-scaled)")
    u.add_argument("--prometheus-port", type=int, default=9464,
                   help="Prometheus /metrics of the metrics service (default 9464; 0: off)")

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

    st = sub.add_parser("status", help="jobs of a live cluster: state, reason, GPUs, progress")
    st.add_argument("--nats-url", default=default_url(), help=URL_HELP)
    st.add_argument("--json", action="store_true", help="print the scheduler's state as JSON")


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
                        stream_replicas=args.stream_replicas)
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
                         state_dir=Path(tmp))
        return asyncio.run(up(opts))


def cmd_submit(args: argparse.Namespace) -> int:
    job_id = args.job_id or f"job-{secrets.token_hex(4)}"
    print(asyncio.run(_submit(args, job_id)))
    return 0


async def _submit(args: argparse.Namespace, job_id: str) -> str:
    nc = await nats.connect(servers=server_list(args.nats_url), connect_timeout=5,
                            max_reconnect_attempts=0)
    try:
        body: dict[str, Any] = {"job_id": job_id, "tenant": args.tenant, "model": args.model,
                                "gpus": args.gpus, "iterations": args.iterations,
                                "iteration_time_s": args.iteration_time}
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
                               getattr(args, "node", None), getattr(args, "policy", None))))
    return 0


async def _operate(url: str, command: str, job: str | None, node: str | None,
                   policy: str | None) -> str:
    """Check the target against the scheduler's state, send the command, await its effect."""
    nc = await nats.connect(servers=server_list(url), connect_timeout=5,
                            max_reconnect_attempts=0)
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
    state = asyncio.run(_status(args.nats_url))
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


async def _status(url: str) -> dict[str, Any]:
    nc = await nats.connect(servers=server_list(url), connect_timeout=5,
                            max_reconnect_attempts=0)
    try:
        return await _state(nc)
    finally:
        await nc.close()


def cmd_demo(args: argparse.Namespace) -> int:
    return asyncio.run(run_demo(args.out, Console(width=120)))


COMMANDS = {"serve": cmd_serve, "up": cmd_up, "submit": cmd_submit, "status": cmd_status,
            "demo": cmd_demo, "cancel": cmd_operator, "suspend": cmd_operator,
            "resume": cmd_operator, "drain": cmd_operator, "set-policy": cmd_operator}
