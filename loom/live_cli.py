"""The live-cluster commands: `loom serve`, `loom up`, `loom submit`, `loom status`."""

from __future__ import annotations

import argparse
import asyncio
import errno
import getpass
import json
import secrets
import socket
import tempfile
from pathlib import Path
from typing import Any

import nats
from pydantic import ValidationError
from rich.console import Console

import policies
from domain.workloads import FAMILIES, for_trace_model
from loom import status_view
from loom.preflight import require_torch
from loom.serve import ServeOptions, control_subject, serve
from loom.up import UpOptions, up
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import encode
from schemas.events import OperatorCommand, envelope
from schemas.job import SubmitJob
from schemas.tenants import load_tenants
from schemas.userinput import describe
from services.runtime.bus import MSG_ID
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_errors import NatsNoStreamError
from services.runtime.nats_live import with_connection
from services.runtime.stream_limits import StreamLimits
from services.scheduler.liveness import LivenessConfig, RetryPolicy
from traces import load_cluster, load_trace


class PortInUse(ValueError):
    """A port a command would bind is taken; the message names the flag that moves it."""


def check_port(port: int, flag: str, addr: str = "127.0.0.1") -> None:
    """Fail before anything starts if `port` cannot be bound on `addr`: the server started
    later would die with "Address already in use" after the rest had come up."""
    if not 0 < port < 65536:
        raise ValueError(f"{flag} {port}: not a port (1-65535)")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ValueError(f"{flag}: cannot resolve the address {addr!r} ({exc.strerror})") \
            from None
    with socket.socket(family, kind, proto) as probe:
        # As the HTTP server binds: a port left in TIME_WAIT is free, a listener's is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"port {port} is in use: choose another with {flag}") from None
            raise ValueError(f"{flag} {port}: cannot bind {addr} ({exc.strerror})") from None


def cmd_serve(args: argparse.Namespace) -> int:
    if args.service == "metrics" and args.prometheus_port:
        check_port(args.prometheus_port, "--prometheus-port", args.prometheus_addr)
    cluster = load_cluster(args.cluster, args.gpus_per_server)
    jobs = load_trace(args.trace).jobs if args.trace else ()
    if args.service == "injector" and not jobs:
        raise ValueError("injector needs --trace")
    opts = ServeOptions(args.service, args.nats_url, cluster, policy=args.policy,
                        round_s=args.round_s, overhead=args.overhead, node=args.node,
                        jobs=jobs, time_scale=args.time_scale, origin=args.origin,
                        seed=args.seed, prometheus_port=args.prometheus_port,
                        trainers=args.trainers, fake_gpus=args.fake_gpus,
                        fake_faults=args.fake_faults, health_checks=not args.no_health_checks,
                        gpu_backend=args.gpu_backend, checkpoint_root=args.checkpoint_root,
                        grace_s=args.grace_s, fast_forward=args.fast_forward,
                        prometheus_addr=args.prometheus_addr,
                        advertise_addr=args.advertise_addr,
                        stream_replicas=args.stream_replicas, auth=NatsAuth.from_args(args),
                        stream_limits=stream_limits(args),
                        heartbeat_s=args.heartbeat_s,
                        checkpoint_every=args.checkpoint_every,
                        liveness=liveness_config(args), job_user=args.job_user,
                        retry=retry_policy(args),
                        tenants=load_tenants(args.tenants) if args.tenants else None,
                        replica=args.replica, lease_s=args.lease_s, renew_s=args.renew_s,
                        forecast_every_s=args.forecast_every if args.forecast_every >= 0
                        else None)
    return asyncio.run(serve(opts))


def liveness_config(args: argparse.Namespace) -> LivenessConfig:
    """The scheduler's lost-node and launch deadlines (`live_args.add_fault_arguments`)."""
    return LivenessConfig(misses=args.node_misses, launch_timeout_s=args.launch_timeout_s)


def retry_policy(args: argparse.Namespace) -> RetryPolicy:
    """The scheduler's backoff for failed trainers (`live_args.add_fault_arguments`)."""
    return RetryPolicy(max_attempts=args.retry_attempts, base_s=args.retry_base_s,
                       factor=args.retry_factor, cap_s=args.retry_cap_s,
                       jitter=args.retry_jitter, seed=args.seed)


def stream_limits(args: argparse.Namespace) -> StreamLimits:
    """The streams' bounds (`live_args.add_stream_arguments`); a bad one names its flag."""
    return StreamLimits(max_bytes=args.stream_max_bytes, max_age_s=args.stream_max_age,
                        deadletter_max_bytes=args.deadletter_max_bytes)


def cmd_up(args: argparse.Namespace) -> int:
    auth = NatsAuth.from_args(args)
    # Built here, so a bad value fails `up` itself, not the scheduler process it starts.
    liveness, retry = liveness_config(args), retry_policy(args)
    limits = stream_limits(args)
    tenants = _checked_tenants(args.tenants)
    if args.local_nodes is not None and (args.local_nodes < 1 or args.gpus_per_node < 1):
        raise ValueError("--local-nodes and --gpus-per-node must be at least 1")
    if args.local_nodes is not None and args.trainers == "pytorch":
        require_torch("loom up --local-nodes (with --trainers pytorch, the default)")
    cluster = (ClusterSpec.uniform(1, args.local_nodes, args.gpus_per_node,
                                   gpu_type=args.gpu_type)
               if args.local_nodes is not None else load_cluster(args.cluster))
    # What `up` would bind, and the server it would use, checked before anything starts (an
    # embedded nats-server takes a port found free; no flag sets it).
    if args.prometheus_port:
        check_port(args.prometheus_port, "--prometheus-port")
    if args.nats_url is not None:
        asyncio.run(with_connection(args.nats_url, auth, _connected))
    with tempfile.TemporaryDirectory(prefix="loom-up-") as tmp:
        cluster_arg = args.cluster
        if args.local_nodes is not None:
            spec = Path(tmp) / "local-cluster.json"
            spec.write_text(cluster.model_dump_json())
            cluster_arg = str(spec)
        opts = UpOptions(cluster, cluster_arg, nats_url=args.nats_url, policy=args.policy,
                         round_s=args.round_s, overhead=args.overhead,
                         time_scale=args.time_scale, local_nodes=args.local_nodes is not None,
                         log_level=args.log_level, prometheus_port=args.prometheus_port or None,
                         trainers=args.trainers, gpus_per_node=args.gpus_per_node,
                         state_dir=Path(tmp), auth=auth, tenants=tenants,
                         liveness=liveness, retry=retry, stream_limits=limits,
                         forecast_every_s=args.forecast_every)
        return asyncio.run(up(opts))


async def _connected(_: Any) -> None:
    """Nothing to do: connecting (and logging in) was the check."""


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
    if args.job_command:
        body["command"] = args.job_command
        if args.env:
            body["env"] = dict(_pair(e) for e in args.env)
        for key in ("cwd", "progress_regex"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
    elif args.env or args.cwd or args.progress_regex:
        raise ValueError("--env, --cwd and --progress-regex need --command")
    else:
        check_model(args.model)  # a command job's model is only its label
    check_submission(body)  # a bad job is refused here, not dead-lettered there

    async def send(nc: Any) -> str:
        if args.deadline_in is not None:
            state = await _state(nc)
            body["deadline_s"] = state["now"] + args.deadline_in
        # The same bytes `nats pub loom.jobs.submit '<json>'` sends, with the id as Nats-Msg-Id
        # so a retried submit is dropped as a duplicate. People have no JetStream API of their
        # own (deploy/nats/accounts.conf), only the stream's acknowledgement of the publish.
        try:
            await nc.jetstream().publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                                         headers={MSG_ID: f"submit.{job_id}"})
        except nats.js.errors.NoStreamResponseError:
            raise NatsNoStreamError(
                f"no stream at {args.nats_url} stores {subjects.JOB_SUBMIT}: the cluster is "
                "not up (`loom up`, or `loom serve scheduler`, creates it)") from None
        return job_id

    return await with_connection(args.nats_url, NatsAuth.from_args(args), send)


# The `loom submit` flag of each job field, so a refusal names what the user typed.
SUBMIT_FLAGS = {"job_id": "--job-id", "tenant": "--tenant", "model": "--model",
                "gpus": "--gpus", "iterations": "--iterations",
                "iteration_time_s": "--iteration-time", "deadline_s": "--deadline-in",
                "command": "--command", "env": "--env", "cwd": "--cwd",
                "progress_regex": "--progress-regex"}


def check_submission(body: dict[str, Any]) -> None:
    """Validate `body` as the scheduler will (strict JSON, as it travels); a ValueError in
    Loom's words, naming the flag, the value and what is allowed."""
    try:
        SubmitJob.model_validate_json(json.dumps(body), strict=True)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False)[:5]:
            loc = err["loc"]
            flag = SUBMIT_FLAGS.get(str(loc[0])) if loc else None
            if flag is not None:
                err = {**err, "loc": (flag, *loc[1:])}
            problems.append(describe(err, SubmitJob.model_fields))
        raise ValueError("loom submit: " + "; ".join(problems)) from None


# Named in check_model's message; tests/cli/test_submit.py checks that each is accepted.
TRACE_MODEL_EXAMPLES = ("resnet50", "vgg16", "bert", "gpt2", "a2c")


def check_model(model: str) -> None:
    """Refuse a model no trainer runs, before anything is sent: the scheduler would accept the
    job, then every node agent would fail to launch it. The rule is the node agent's
    (`services.nodeagent.agent.family_of`): a workload family, or a trace model name of one."""
    if model not in FAMILIES and for_trace_model(model) is None:
        raise ValueError(f"loom submit: unknown model {model!r}; known models: "
                         f"{', '.join(sorted(FAMILIES))} (or a trace model name of these "
                         f"families, such as {', '.join(TRACE_MODEL_EXAMPLES)}; `loom models` "
                         "lists them)")


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
    async def operate(nc: Any) -> str:
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

    return await with_connection(url, auth, operate)


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
    states, tenants = status_view.filters(args)
    rows, matched = status_view.select(state["jobs"], states, tenants, args.sort, args.limit)
    if args.json:
        # As the scheduler gave it; filters, a sort or a limit, when given, pick its jobs.
        narrowed = bool(states or tenants or args.limit is not None or args.sort != "submit")
        print(json.dumps({**state, "jobs": rows} if narrowed else state, indent=2))
        return 0
    Console(width=160).print(status_view.status_table(state, rows, matched))
    return 0


async def _status(url: str, auth: NatsAuth | None = None) -> dict[str, Any]:
    return await with_connection(url, auth, _state)


def cmd_demo(args: argparse.Namespace) -> int:
    require_torch("loom demo")  # before anything starts: exit 2 with the install command
    from loom.demo import run_demo  # its imports serve the demo alone

    return asyncio.run(run_demo(args.out, Console(width=120), timeout_s=args.timeout,
                                log_level=args.log_level))


COMMANDS = {"serve": cmd_serve, "up": cmd_up, "submit": cmd_submit, "status": cmd_status,
            "demo": cmd_demo, "cancel": cmd_operator, "suspend": cmd_operator,
            "resume": cmd_operator, "drain": cmd_operator, "set-policy": cmd_operator}
