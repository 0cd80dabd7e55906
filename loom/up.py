"""`loom up`: a local cluster, each service its own `loom serve` process as on a real
cluster, on an embedded NATS server or a given one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from loom.live_args import url_file
from loom.serve import CONTROL_PLANE, drop_signals, on_signals, ping
from schemas.cluster import ClusterSpec
from services.runtime.children import die_with_parent
from services.runtime.logging import get_logger
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_live import server_list
from services.runtime.natsserver import EmbeddedNats, NatsServerError, port_free
from services.runtime.stream_limits import StreamLimits
from services.scheduler.liveness import LivenessConfig, RetryPolicy

log = get_logger("loom.up")
DEFAULT_NATS_PORT = 4222
# What `loom up` prints as a ready `nats pub` line: a job the bundled trainer runs.
EXAMPLE_JOB = ('{"model": "resnet18", "gpus": 1, "iterations": 200, "iteration_time_s": 0.1, '
               '"tenant": "demo"}')


@dataclass(frozen=True)
class UpOptions:
    cluster: ClusterSpec
    cluster_arg: str  # how the children load the same cluster
    nats_url: str | None = None
    policy: str = "fifo"
    round_s: float | None = None
    overhead: str = "none"
    time_scale: float = 1.0
    local_nodes: bool = True
    log_level: str = "warning"
    prometheus_port: int | None = None
    trainers: str = "pytorch"
    gpus_per_node: int = 4  # fake GPUs of each local node agent
    state_dir: Path = Path("/var/lib/loom")  # checkpoints of local node agents go under it
    auth: NatsAuth = field(default_factory=NatsAuth)  # children get it as LOOM_NATS_* vars
    tenants: str | None = None  # the scheduler's tenants file
    forecast_every_s: float = 60.0  # the scheduler's `--forecast-every` (negative: never)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)  # scheduler: lost nodes
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # scheduler: failed trainers; seed
    stream_limits: StreamLimits = field(default_factory=StreamLimits)  # every service gets them
    # The embedded server's port: NATS's standard one when it is free (what `nats` and the
    # other live commands try first), else any free port; None: any free port.
    nats_port: int | None = DEFAULT_NATS_PORT
    # Where the services' (and their trainers') output goes; None: this process's own.
    log_file: Path | None = None
    announce: bool = True  # print how to reach the cluster once it is up (`loom demo`: no)


def stream_flags(limits: StreamLimits) -> list[str]:
    """The `serve` flags that rebuild `limits` in a child: any service may create the
    streams, whichever starts first (repr, as in `fault_flags`: the age goes through
    unrounded)."""
    return ["--stream-max-bytes", str(limits.max_bytes),
            "--stream-max-age", repr(limits.max_age_s),
            "--deadletter-max-bytes", str(limits.deadletter_max_bytes)]


def fault_flags(liveness: LivenessConfig, retry: RetryPolicy) -> list[str]:
    """The `serve scheduler` flags that rebuild `liveness` and `retry` in the child (repr:
    a float goes through the command line unchanged)."""
    return ["--node-misses", str(liveness.misses),
            "--launch-timeout-s", repr(liveness.launch_timeout_s),
            "--retry-attempts", str(retry.max_attempts), "--retry-base-s", repr(retry.base_s),
            "--retry-factor", repr(retry.factor), "--retry-cap-s", repr(retry.cap_s),
            "--retry-jitter", repr(retry.jitter), "--seed", str(retry.seed)]


def up_commands(opts: UpOptions, url: str, origin: float) -> list[list[str]]:
    """The `loom serve` argument lists of the processes `up` starts: control plane first."""
    common = ["--nats-url", url, "--cluster", opts.cluster_arg, "--time-scale",
              str(opts.time_scale), "--origin", repr(origin), "--overhead", opts.overhead,
              "--log-level", opts.log_level, *stream_flags(opts.stream_limits)]
    commands = [[svc, *common] for svc in CONTROL_PLANE]
    commands[0] += ["--policy", opts.policy, *fault_flags(opts.liveness, opts.retry),
                    "--forecast-every", repr(opts.forecast_every_s)]
    if opts.prometheus_port is not None:
        commands[CONTROL_PLANE.index("metrics")] += ["--prometheus-port",
                                                     str(opts.prometheus_port)]
    if opts.round_s is not None:
        commands[0] += ["--round-s", str(opts.round_s)]
    if opts.tenants is not None:
        commands[0] += ["--tenants", opts.tenants]
    if opts.local_nodes:
        agent = ["--trainers", opts.trainers, "--fake-gpus", str(opts.gpus_per_node),
                 "--checkpoint-root", str(opts.state_dir / "checkpoints")]
        commands += [["nodeagent", "--node", n.node_id, *agent, *common]
                     for n in opts.cluster.nodes]
    return commands


async def up(opts: UpOptions, ready: asyncio.Event | None = None,
             stop: asyncio.Event | None = None, url_out: list[str] | None = None) -> int:
    """Start (or use) a NATS server, the control plane and one agent per node; stop on signal.

    Each service is its own `loom serve` process, as on a real cluster.
    """
    signals: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        signals = on_signals(stop)
    server = None
    url = opts.nats_url
    children: list[asyncio.subprocess.Process] = []
    codes: list[int] = []
    context: Path | None = None
    output = None if opts.log_file is None else opts.log_file.open("ab")
    try:
        if url is None:
            server = await _embedded_nats(opts.nats_port)
            url = server.url
        if url_out is not None:
            url_out.append(url)
        commands = up_commands(opts, url, time.time())
        for cmd in commands:
            if stop.is_set():
                break
            children.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "loom.cli", "serve", *cmd,
                env={**os.environ, **opts.auth.to_env()}, preexec_fn=die_with_parent,
                stdout=output, stderr=output))
        # A signal while the services start stops the start, not only what follows it.
        if not await _until_stopped(_await_services(url, len(commands), opts.auth), stop):
            return 130
        record = url_file()
        record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        record.write_text(url)
        context = write_nats_context(record.parent / "loom.json", url, opts.auth)
        log.info("cluster up", nats=url, services=len(commands))
        if opts.announce:
            print(reach_text(url, len(commands), opts, context), flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        for child in children:
            if child.returncode is None:
                child.terminate()
        codes = [await child.wait() for child in children]
        with contextlib.suppress(OSError):
            if url is not None and url_file().read_text().strip() == url:
                url_file().unlink()
                if context is not None:
                    context.unlink()
        drop_signals(signals)
        if server is not None:
            await server.stop()
        if output is not None:
            output.close()
    return 0 if all(c == 0 for c in codes) else 1


async def _embedded_nats(port: int | None) -> EmbeddedNats:
    """A private server on `port` when it is free, else on any free port."""
    if port is not None and port_free(port):
        try:
            return await EmbeddedNats.start(port=port)
        except NatsServerError:  # taken between the check and the bind: any port will do
            pass
    return await EmbeddedNats.start()


async def _until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run `work` unless `stop` is set first (then cancel it): whether `work` finished."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return False
    task.result()  # its error, if it failed
    return True


def write_nats_context(path: Path, url: str, auth: NatsAuth) -> Path:
    """A NATS CLI context for this cluster (`nats --context FILE ...`, or copy it to
    ~/.config/nats/context/ and `nats context select loom`); private, as it may hold a
    password."""
    context: dict[str, str] = {"description": "Loom: the cluster `loom up` started", "url": url}
    for key, value in (("user", auth.user), ("password", auth.password), ("creds", auth.creds),
                       ("nkey", auth.nkey), ("ca", auth.tls_ca), ("cert", auth.tls_cert),
                       ("key", auth.tls_key), ("inbox_prefix", auth.inbox)):
        if value:
            context[key] = value
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(context, f, indent=2)
        f.write("\n")
    return path


def reach_text(url: str, services: int, opts: UpOptions, context: Path) -> str:
    """What `loom up` prints once the cluster is up: where it is and how to reach it."""
    job = shlex.quote(EXAMPLE_JOB)
    prometheus = ("" if opts.prometheus_port is None else
                  f"\n  metrics:  http://127.0.0.1:{opts.prometheus_port}/metrics")
    return (f"loom up: {services} services on {url} ({opts.cluster.total_gpus} GPUs, policy "
            f"{opts.policy}); Ctrl-C to stop\n"
            f"  NATS:     {url}{prometheus}\n"
            f"  submit:   loom submit --model resnet18 --gpus 1 --iterations 200\n"
            f"  or:       nats --context {shlex.quote(str(context))} pub loom.jobs.submit {job}\n"
            f"  status:   loom status\n"
            f"  (nats is the NATS CLI: https://github.com/nats-io/natscli/releases, or "
            f"`go install github.com/nats-io/natscli/nats@latest`; {context} is its context)")


async def _await_services(url: str, count: int, auth: NatsAuth,
                          timeout: float = 60.0) -> None:
    """Until `count` Loom services answer the micro-service PING."""
    nc = await nats.connect(servers=server_list(url), **auth.connect_kwargs())
    try:
        deadline = time.monotonic() + timeout
        while True:
            names = await ping(nc)
            if len(names) >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(names)} of {count} services came up: {names}")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()
