"""`loom up`: a local cluster, each service its own `loom serve` process as on a real
cluster, on an embedded NATS server or a given one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats

from loom.live_args import url_file
from loom.serve import CONTROL_PLANE, drop_signals, on_signals, ping
from schemas.cluster import ClusterSpec
from services.runtime.children import die_with_parent
from services.runtime.logging import get_logger
from services.runtime.nats_auth import NatsAuth
from services.runtime.nats_live import server_list
from services.runtime.natsserver import EmbeddedNats
from services.runtime.stream_limits import StreamLimits
from services.scheduler.liveness import LivenessConfig, RetryPolicy

log = get_logger("loom.up")


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
    liveness: LivenessConfig = field(default_factory=LivenessConfig)  # scheduler: lost nodes
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # scheduler: failed trainers; seed
    stream_limits: StreamLimits = field(default_factory=StreamLimits)  # every service gets them


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
    commands[0] += ["--policy", opts.policy, *fault_flags(opts.liveness, opts.retry)]
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
    server = None
    url = opts.nats_url
    if url is None:
        server = await EmbeddedNats.start()
        url = server.url
    if url_out is not None:
        url_out.append(url)
    commands = up_commands(opts, url, time.time())
    children = []
    signals: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        signals = on_signals(stop)
    try:
        for cmd in commands:
            children.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "loom.cli", "serve", *cmd,
                env={**os.environ, **opts.auth.to_env()}, preexec_fn=die_with_parent))
        await _await_services(url, len(commands), opts.auth)
        record = url_file()
        record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        record.write_text(url)
        log.warning("cluster up", nats=url, services=len(commands))
        print(f"loom up: {len(commands)} services on {url} "
              f"({opts.cluster.total_gpus} GPUs, policy {opts.policy}); Ctrl-C to stop",
              flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        for child in children:
            if child.returncode is None:
                child.terminate()
        codes = [await child.wait() for child in children]
        with contextlib.suppress(OSError):
            if url_file().read_text().strip() == url:
                url_file().unlink()
        drop_signals(signals)
        if server is not None:
            await server.stop()
    return 0 if all(c == 0 for c in codes) else 1


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
