"""What each service of a live cluster is built from (`ServeOptions`), and the registry of
their builders: `loom serve <service>` looks its service up here."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from domain.overhead import parse_overhead
from loom.live_args import SERVICES
from schemas.cluster import ClusterSpec, NodeSpec
from schemas.codec import encode
from schemas.events import GpuInfo, GpuLink, NodeInfo, envelope
from schemas.job import JobSpec
from schemas.subjects import QUEUES_REQUEST
from schemas.tenants import TenantsConfig
from services.injector.core import InjectorCore
from services.metrics.core import MetricsCore
from services.nodeagent.agent import DEFAULT_GRACE_S, TrainerNodeCore, TrainerSettings
from services.nodeagent.gpu import FakeBackend, FakeFaults, GpuBackend, detect_backend
from services.nodeagent.simfleet import SimNodeCore
from services.placer.core import PlacerCore
from services.runtime.nats_auth import NatsAuth
from services.runtime.service import Core
from services.runtime.stream_limits import StreamLimits
from services.scheduler.build import build_scheduler
from services.scheduler.core import SchedulerCore
from services.scheduler.liveness import LivenessConfig, RetryPolicy


@dataclass(frozen=True)
class ServeOptions:
    service: str
    nats_url: str
    cluster: ClusterSpec
    policy: str = "fifo"
    round_s: float | None = None
    overhead: str = "none"
    node: str | None = None  # nodeagent: which node of the cluster this agent is
    jobs: Sequence[JobSpec] = ()  # injector: the trace to replay
    time_scale: float = 1.0
    origin: float | None = None
    seed: int = 0
    prometheus_port: int | None = None  # metrics: serve /metrics here
    prometheus_addr: str = "127.0.0.1"
    stream_replicas: int = 1  # copies of the event stream on a NATS cluster
    stream_limits: StreamLimits = field(default_factory=StreamLimits)  # if it creates them
    trainers: str = "simulated"  # nodeagent: "pytorch" (real trainer processes) or "simulated"
    fake_gpus: int | None = None  # nodeagent: K fake GPUs instead of NVML/DCGM discovery
    gpu_backend: str = "auto"  # nodeagent: auto | dcgm | nvml
    fake_faults: str = ""  # nodeagent with fake GPUs: what they pretend is wrong (FakeFaults)
    health_checks: bool = True  # nodeagent: the doctor's checks at start and on heartbeats
    checkpoint_root: Path = Path("/var/lib/loom/checkpoints")
    job_user: str | None = None  # nodeagent: run trainers as this unprivileged user
    grace_s: float = DEFAULT_GRACE_S
    fast_forward: int = 0
    advertise_addr: str = "127.0.0.1"  # nodeagent: the address other nodes' trainers use
    auth: NatsAuth = field(default_factory=NatsAuth)  # credentials and TLS files for NATS
    heartbeat_s: float = 5.0  # nodeagent: seconds between heartbeats
    checkpoint_every: int = 0  # nodeagent: trainers checkpoint every N iterations (0: off)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)  # scheduler: lost nodes
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # scheduler: failed trainers
    tenants: TenantsConfig | None = None  # scheduler: quotas and fair share; None: no limits
    forecast_every_s: float | None = None  # scheduler: start forecasts at most this often
    # scheduler: publish the queues' status (for Prometheus) when it changes after a cycle, and
    # at least this often while cycles run, to refresh decayed usage; None: never
    queue_status_every_s: float | None = 60.0
    replica: str | None = None  # scheduler: this replica's id; elect a leader among replicas
    lease_s: float = 6.0  # scheduler replicas: how long a lease lasts (real seconds)
    renew_s: float = 2.0  # scheduler replicas: how often it is renewed or polled


@dataclass(frozen=True)
class Built:
    """A service's core, and what its shell needs beyond the core."""

    core: Core
    agent: TrainerNodeCore | None = None  # a trainer-launching node agent (its own shell),
    backend: GpuBackend | None = None  # and the GPUs it found
    metrics: MetricsCore | None = None  # the metrics service: it also watches the streams
    # Request/reply endpoints besides `state`: micro endpoint name → (subject, the reply at
    # cluster time `now`).
    endpoints: Mapping[str, tuple[str, Callable[[float], bytes]]] = field(default_factory=dict)


def scheduler_for(opts: ServeOptions) -> SchedulerCore:
    """The scheduler's core (a replica builds one afresh each time it wins the lease)."""
    return build_scheduler(opts.policy, opts.cluster, round_s=opts.round_s,
                           overhead=opts.overhead, seed=opts.seed, liveness=opts.liveness,
                           retry=opts.retry, tenants=opts.tenants,
                           forecast_every_s=opts.forecast_every_s,
                           queue_status_every_s=opts.queue_status_every_s)


def queues_reply(core: SchedulerCore, now: float) -> bytes:
    """The scheduler's answer to `loom queues`: its queues' status, a msgpack envelope."""
    return encode(envelope(core.queues(now), event_id=f"queues.{secrets.token_hex(8)}",
                           occurred_at=now, producer=core.name, causation_id=None))


def _scheduler(opts: ServeOptions) -> Built:
    core = scheduler_for(opts)
    return Built(core, endpoints={
        "queues": (QUEUES_REQUEST, lambda now: queues_reply(core, now))})


def _metrics(core: MetricsCore) -> Built:
    return Built(core, metrics=core)


def _node_agent(opts: ServeOptions) -> Built:
    node = _node(opts)
    if opts.trainers == "simulated":
        return Built(SimNodeCore(node, parse_overhead(opts.overhead), None))
    if opts.trainers != "pytorch":
        raise ValueError(f"--trainers must be pytorch or simulated, not {opts.trainers!r}")
    return _trainer_agent(opts, node)


BUILDERS: dict[str, Callable[[ServeOptions], Built]] = {
    "scheduler": _scheduler,
    "placer": lambda opts: Built(PlacerCore(opts.cluster)),
    "metrics": lambda opts: _metrics(MetricsCore(opts.cluster.total_gpus)),
    "injector": lambda opts: Built(InjectorCore(opts.jobs)),
    "nodeagent": _node_agent,
}


def build_service(opts: ServeOptions) -> Built:
    builder = BUILDERS.get(opts.service)
    if builder is None:
        raise ValueError(f"unknown service {opts.service!r}; one of {', '.join(SERVICES)}")
    return builder(opts)


def _node(opts: ServeOptions) -> NodeSpec:
    nodes = {n.node_id: n for n in opts.cluster.nodes}
    if opts.node not in nodes:
        raise ValueError(f"nodeagent needs --node, one of the cluster's nodes "
                         f"({', '.join(list(nodes)[:8])}{', …' if len(nodes) > 8 else ''})")
    return nodes[opts.node]


def _trainer_agent(opts: ServeOptions, node: NodeSpec) -> Built:
    """The trainer-launching node agent and the GPU backend it found its GPUs with."""
    if opts.fake_faults and opts.fake_gpus is None:
        raise ValueError("--fake-faults needs --fake-gpus (faults are pretended by fake GPUs)")
    backend: GpuBackend = (FakeBackend(opts.fake_gpus, node.gpu_type, node.node_id,
                                       faults=FakeFaults.parse(opts.fake_faults))
                           if opts.fake_gpus is not None else detect_backend(opts.gpu_backend))
    found = backend.discover()
    inventory = NodeInfo(
        node_id=node.node_id, backend=backend.name,
        gpus=tuple(GpuInfo(index=g.index, uuid=g.uuid, name=g.name,
                           memory_bytes=g.memory_bytes) for g in found),
        links=tuple(GpuLink(a=x.a, b=x.b, kind=x.kind) for x in backend.topology()),
        address=opts.advertise_addr)
    settings = TrainerSettings(python=sys.executable, checkpoint_root=opts.checkpoint_root,
                               grace_s=opts.grace_s, fast_forward=opts.fast_forward,
                               mps_dir=opts.checkpoint_root.parent / "mps",
                               heartbeat_s=opts.heartbeat_s,
                               checkpoint_every=opts.checkpoint_every)
    core = TrainerNodeCore(node, [g.uuid for g in found], settings,
                           addresses={node.node_id: opts.advertise_addr}, inventory=inventory)
    return Built(core, agent=core, backend=backend)
