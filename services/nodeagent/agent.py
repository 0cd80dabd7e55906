"""The node agent of a live cluster: real trainer processes on this node's GPUs.

A deterministic core, like every Loom core: it turns node commands and what its trainers
report into effects, and never touches a process itself. Besides `Publish`, it asks its shell
(`services.nodeagent.live`) to `Spawn` and `Kill` trainer processes; the shell feeds back each
trainer's protocol records (`schemas.trainer`) and exit codes.

A job placed on several nodes runs one trainer process per GPU (its rank): ranks are
numbered along the placement, so every node of the gang computes the same ranks, world size,
rendezvous address (the first node of the placement, as that node announced it in its
`NodeInfo`) and port (from the job and the cycle that launched it) without talking to the
others. The node with rank 0 leads: it reports the
job's progress (at every cycle, and when it stops) and its completion.

Stopping is graceful: the trainers get SIGTERM and the grace period to checkpoint; the
progress reported is what rank 0 checkpointed. A job launched again here while its previous
run is still stopping starts once that run has exited, so it resumes from the checkpoint
the previous run has just written.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from domain import textprogress
from domain.trainer_config import TrainerConfig
from domain.workloads import FAMILIES, for_trace_model
from schemas import subjects
from schemas import trainer as protocol
from schemas.causes import LAUNCH_REFUSED
from schemas.cluster import NodeSpec
from schemas.events import (
    CycleStarted,
    Envelope,
    GpuSample,
    JobFinished,
    Launch,
    NodeCommand,
    NodeHealth,
    NodeHeartbeat,
    NodeInfo,
    NodeStatus,
    TrainerReport,
)
from schemas.job import JobSpec, valid_job_id
from services.nodeagent.gate import CommandGate
from services.runtime.effects import PRIORITY_INPUT, Effect, LocalEffect, Publish, SetTimer
from services.runtime.service import CoreDefaults, Subscribe

DEFAULT_GRACE_S = 30.0
# Below Linux's ephemeral range (32768-60999 by default), so that no outgoing connection
# holds a job's rendezvous port, nor a client connects to itself on it.
PORT_BASE, PORT_SPAN = 20000, 12000
DEFAULT_BATCH = 32


@dataclass(frozen=True, slots=True)
class Spawn(LocalEffect):
    """Start one rank of a job on the given GPUs (by UUID)."""

    job_id: str
    rank: int
    argv: tuple[str, ...]
    gpu_uuids: tuple[str, ...]
    checkpoint_dir: str
    mps_percentage: int | None = None  # co-located jobs share the GPUs' SMs through MPS
    env: tuple[tuple[str, str], ...] = ()  # a command job's rank environment and extras
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class Kill(LocalEffect):
    """SIGTERM one rank; SIGKILL it after `grace_s`."""

    job_id: str
    rank: int
    grace_s: float


@dataclass(frozen=True, slots=True)
class SampleGpus(LocalEffect):
    """Read the GPUs' telemetry and health and hand them to `on_telemetry` (the heartbeat)."""


@dataclass(frozen=True)
class TrainerSettings:
    """How this node runs trainers (the same on every node of a cluster)."""

    python: str = "python3"
    checkpoint_root: Path = Path("/var/lib/loom/checkpoints")  # shared across nodes
    grace_s: float = DEFAULT_GRACE_S
    fast_forward: int = 0  # real iterations per launch before fast-forwarding (0: never)
    report_every: int = 10
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = 1
    log_level: Literal["debug", "info", "warning", "error"] = "warning"  # trainers' stderr
    heartbeat_s: float = 5.0
    # Periodic checkpoints (0: only when stopped): what a job lost with its node restarts from.
    checkpoint_every: int = 0
    mps_dir: Path = Path("/run/loom/mps")  # the MPS daemon's pipe and log directories


@dataclass
class _Job:
    launch: Launch
    ranks: dict[int, str]  # local rank → GPU UUID
    leader: bool
    alive: set[int] = field(default_factory=set)
    iteration: float = 0.0  # rank 0's latest report
    stopping: bool = False
    stop_cycle: int = 0
    finished: bool = False
    failure: str | None = None
    relaunch: tuple[Launch, int] | None = None  # (launch, cycle) waiting for this run to exit
    printed: re.Pattern[str] | None = None  # a command job's progress regex (None: default)
    reported: bool = False  # rank 0 reported an iteration (a protocol record or a printed line)


def local_ranks(node_id: str, launch: Launch) -> tuple[dict[int, int], int]:
    """{rank: GPU index on this node} and the world size, ranks numbered along the placement."""
    ranks: dict[int, int] = {}
    rank = 0
    for node, gpus in launch.placement:
        for gpu in gpus:
            if node == node_id:
                ranks[rank] = gpu
            rank += 1
    return ranks, rank


def checkpoint_dir(root: Path, job_id: str) -> Path:
    """The job's checkpoint directory, named by its id checked again here: the id rule (no
    separator, no leading dot) keeps it one level under `root` even if a message got past
    the schemas."""
    return root / valid_job_id(job_id)


def rendezvous_port(job_id: str, cycle: int, on_one_node: str | None = None) -> int:
    """Same on every node of the gang; new for each launch (no clash with a closing run). A
    gang on one node agrees with no other node: `on_one_node` (that node's checkpoint root)
    then enters the hash too, so clusters sharing a host (two test stacks running the same
    job ids) draw different ports."""
    salt = "" if on_one_node is None else f"{on_one_node}:"
    digest = hashlib.sha256(f"{salt}{job_id}:{cycle}".encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN


def global_batch(spec_batch: int | None, world: int) -> int:
    """The job's global batch, rounded up to split evenly across its ranks."""
    batch = spec_batch or DEFAULT_BATCH
    return -(-batch // world) * world


def family_of(model: str) -> str:
    family = model if model in FAMILIES else for_trace_model(model)
    if family is None:
        raise ValueError(f"no trainer workload for model {model!r} "
                         f"(families: {', '.join(FAMILIES)})")
    return family


class TrainerNodeCore(CoreDefaults):
    def __init__(self, node: NodeSpec, gpu_uuids: Sequence[str], settings: TrainerSettings,
                 addresses: Mapping[str, str] | None = None,
                 inventory: NodeInfo | None = None) -> None:
        if len(gpu_uuids) < node.gpus:
            raise ValueError(f"node {node.node_id} should have {node.gpus} GPUs; "
                             f"found {len(gpu_uuids)}")
        self.node = node
        self.name = f"nodeagent-{node.node_id}"
        self.gpu_uuids = tuple(gpu_uuids)
        self.settings = settings
        self.addresses = dict(addresses or {})
        self.inventory = inventory
        self.jobs: dict[str, _Job] = {}
        self.gate = CommandGate()

    def _on(self, kind: str) -> str:
        """This node's own subject for `kind` (the only node subjects it may publish)."""
        return subjects.node_subject(self.node.node_id, kind)

    def subscriptions(self) -> Sequence[Subscribe]:
        return (Subscribe(subjects.node_command(self.node.node_id)),
                Subscribe(subjects.CYCLE_STARTED),
                Subscribe(subjects.NODE_INFO))

    # -- bus inputs ----------------------------------------------------------------------------
    def handle(self, env: Envelope, now: float) -> list[Effect]:
        body = env.body
        if isinstance(body, NodeCommand):
            cmd = self.gate.admit(body)
            return [] if cmd is None else self._on_command(cmd)
        if isinstance(body, CycleStarted):
            return self._report(body.cycle)
        if isinstance(body, NodeInfo):
            # Where each node's trainers listen: a gang led elsewhere rendezvous there.
            self.addresses[body.node_id] = body.address
            return []
        raise TypeError(f"node agent does not handle {env.type}")

    def start(self, now: float) -> list[Effect]:
        effects: list[Effect] = [SetTimer("heartbeat", now, PRIORITY_INPUT)]
        if self.inventory is not None:
            effects.insert(0, Publish(self._on(subjects.INFO), self.inventory))
        return effects

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if key != "heartbeat":
            raise KeyError(key)
        return [SampleGpus(), SetTimer("heartbeat", now + self.settings.heartbeat_s,
                                       PRIORITY_INPUT)]

    def on_telemetry(self, samples: Sequence[GpuSample],
                     health: NodeHealth | None = None) -> list[Effect]:
        """The heartbeat: alive, with its GPUs' telemetry, the jobs it runs (not those it is
        stopping, unless to rerun them here) so the scheduler can stop any it no longer owns,
        how far it has got through its commands, so the scheduler can tell a run that
        vanished (reconcile, both ways), and what its health checks found (the shell's
        `HealthMonitor`; None when it runs none)."""
        running = sorted(jid for jid, job in self.jobs.items()
                         if not job.stopping or job.relaunch is not None)
        return [Publish(self._on(subjects.HEARTBEAT), NodeHeartbeat(
            node_id=self.node.node_id, gpus=tuple(samples), jobs=tuple(running),
            interval_s=self.settings.heartbeat_s, handled=self.gate.handled, health=health))]

    def _on_command(self, cmd: NodeCommand) -> list[Effect]:
        effects: list[Effect] = []
        for stop in cmd.stops:
            job = self.jobs.get(stop.job_id)
            if job is not None and not job.stopping:
                job.stopping, job.stop_cycle = True, cmd.cycle
                effects += [Kill(stop.job_id, r, self.settings.grace_s) for r in job.alive]
            elif job is not None:
                job.relaunch = None  # stopped before its rerun here could start
        for launch in cmd.launches:
            old = self.jobs.get(launch.job_id)
            if old is not None and old.alive:
                old.relaunch = (launch, cmd.cycle)  # once the previous run has exited
                continue
            effects += self._start(launch, cmd.cycle)
        return effects

    def _start(self, launch: Launch, cycle: int) -> list[Effect]:
        try:
            return self._spawn(launch, cycle)
        except ValueError as exc:  # a launch no trainer here can ever run
            return self._refuse(launch, str(exc))

    def _refuse(self, launch: Launch, reason: str) -> list[Effect]:
        """Report a launch that can never start (an unknown model, a bad argument) as a
        permanent failure, so the scheduler frees its GPUs and fails the job now, instead of
        dropping the whole command and leaving the job holding GPUs with no process. The
        leader reports it; the rest of a gang start nothing."""
        self.jobs.pop(launch.job_id, None)
        if launch.placement[0][0] != self.node.node_id:
            return []
        return [Publish(self._on(subjects.FINISHED), JobFinished(
            job_id=launch.job_id, node_id=self.node.node_id,
            iterations_done=launch.iterations_done, permanent=True,
            failure=f"{LAUNCH_REFUSED}{self.node.node_id}: {reason}"))]

    def _spawn(self, launch: Launch, cycle: int) -> list[Effect]:
        me = self.node.node_id
        ranks, world = local_ranks(me, launch)
        spec = launch.spec
        leader = launch.placement[0][0] == me
        master = self.addresses.get(launch.placement[0][0], "127.0.0.1")
        ckpt = checkpoint_dir(self.settings.checkpoint_root, spec.job_id)
        port = rendezvous_port(spec.job_id, cycle, str(self.settings.checkpoint_root)
                               if len(ranks) == world else None)
        family = "" if spec.command is not None else family_of(spec.model)  # before any state
        job = _Job(launch, {r: self.gpu_uuids[g] for r, g in ranks.items()}, leader,
                   alive=set(ranks), iteration=launch.iterations_done)
        self.jobs[spec.job_id] = job
        # Interleaved jobs (Muri) share their GPUs: each gets an equal share of the SMs.
        sharing = len(launch.colocated)
        mps = max(1, 100 // sharing) if sharing > 1 else None
        if spec.command is not None:
            job.printed = textprogress.compile_pattern(spec.progress_regex)
            return [self._spawn_command(spec, rank, uuid, world, master, port, ckpt, mps)
                    for rank, uuid in sorted(job.ranks.items())]
        effects: list[Effect] = []
        for rank, uuid in sorted(job.ranks.items()):
            cfg = TrainerConfig(
                job_id=spec.job_id, model=family, iterations=spec.iterations,
                batch_size=global_batch(spec.batch_size, world), checkpoint_dir=str(ckpt),
                rank=rank, world_size=world, master_addr=master,
                master_port=port,
                device=self.settings.device,
                fast_forward=self.settings.fast_forward,
                checkpoint_every=self.settings.checkpoint_every,
                report_every=self.settings.report_every, threads=self.settings.threads,
                log_level=self.settings.log_level)
            argv = (self.settings.python, "-m", "services.trainer", *cfg.to_argv())
            effects.append(Spawn(spec.job_id, rank, argv, (uuid,), str(ckpt), mps))
        return effects

    def _spawn_command(self, spec: JobSpec, rank: int, uuid: str, world: int, master: str,
                       rendezvous: int, ckpt: Path, mps: int | None) -> Spawn:
        """One rank of a job's own command, with torchrun's rank environment (so scripts that
        read RANK/WORLD_SIZE/MASTER_* work unchanged) and `PET_*` (so a bare `torchrun` in the
        command joins as a one-process node of the job); `LOOM_*` feed the trainer SDK."""
        assert spec.command is not None
        port = str(rendezvous)
        env = {
            "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": master, "MASTER_PORT": port,
            "PET_NNODES": str(world), "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": "1",
            "PET_MASTER_ADDR": master, "PET_MASTER_PORT": port,
            "LOOM_CHECKPOINT_DIR": str(ckpt), "LOOM_ITERATIONS": str(spec.iterations),
            "LOOM_GRACE_S": repr(self.settings.grace_s),
            "LOOM_REPORT_EVERY": str(self.settings.report_every),
            **(spec.env or {}),
        }
        if spec.batch_size is not None:
            env["LOOM_BATCH_SIZE"] = str(global_batch(spec.batch_size, world))
        return Spawn(spec.job_id, rank, spec.command, (uuid,), str(ckpt), mps,
                     env=tuple(sorted(env.items())), cwd=spec.cwd)

    def _report(self, cycle: int) -> list[Effect]:
        progress = {jid: job.iteration for jid, job in self.jobs.items()
                    if job.leader and not job.stopping and not job.finished}
        if not progress:
            return []
        return [Publish(self._on(subjects.STATUS), NodeStatus(node_id=self.node.node_id,
                                                         cycle=cycle, progress=progress))]

    # -- trainer inputs (from the shell) ---------------------------------------------------
    def on_record(self, job_id: str, rank: int, record: protocol.Record) -> list[Effect]:
        job = self.jobs.get(job_id)
        if job is None or rank != 0:
            return []  # rank 0 speaks for the job; other ranks' records are for their logs
        loss = throughput = None
        resumed = False
        if isinstance(record, protocol.Started):
            resumed = record.resumed
        elif isinstance(record, protocol.Progress):
            loss, throughput = record.loss, record.throughput
        elif isinstance(record, protocol.Stopped):
            loss = record.loss
        elif isinstance(record, protocol.Finished):
            loss, job.finished = record.loss, True
        elif isinstance(record, protocol.Failed):
            job.failure = record.reason
        if isinstance(record, protocol.Checkpointed):
            job.iteration = float(record.iteration)
            return []
        iteration = getattr(record, "iteration", None)
        if iteration is not None:
            job.iteration = float(iteration)
            job.reported = True
        return [Publish(self._on(subjects.PROGRESS), TrainerReport(
            job_id=job_id, node_id=self.node.node_id, event=record.event,
            iteration=int(job.iteration), loss=loss, resumed=resumed, throughput=throughput))]

    def on_output(self, job_id: str, rank: int, line: str) -> list[Effect]:
        """A stdout line that is not a protocol record: a command job's printed progress?"""
        job = self.jobs.get(job_id)
        if job is None or rank != 0 or job.launch.spec.command is None:
            return []
        printed = textprogress.parse(line, job.printed)
        if printed is None:
            return []
        job.iteration, job.reported = float(printed.iteration), True
        return [Publish(self._on(subjects.PROGRESS), TrainerReport(
            job_id=job_id, node_id=self.node.node_id, event="progress",
            iteration=printed.iteration, loss=printed.loss))]

    def on_exit(self, job_id: str, rank: int, code: int) -> list[Effect]:
        job = self.jobs.get(job_id)
        if job is None:
            return []
        job.alive.discard(rank)
        if (rank == 0 and code == 0 and not job.stopping and not job.finished
                and job.failure is None and job.launch.spec.command is not None):
            # A command exiting 0 by itself is done; if it never said how far it got, it did
            # all of the job's iterations.
            job.finished = True
            if not job.reported:
                job.iteration = float(job.launch.spec.iterations)
        if code != 0 and not job.stopping and job.failure is None:
            job.failure = f"rank {rank} exited with {code}"
            if job.alive:
                # A gang is all or nothing: the ranks left would wait in a collective or the
                # rendezvous until its timeout, holding their GPUs for nothing.
                return [Kill(job_id, r, self.settings.grace_s) for r in sorted(job.alive)]
        if job.alive:
            return []
        del self.jobs[job_id]
        effects: list[Effect] = []
        if job.finished:
            self.gate.finish(job_id)
        if job.leader:
            if job.finished:
                effects.append(Publish(self._on(subjects.FINISHED), JobFinished(
                    job_id=job_id, node_id=self.node.node_id, iterations_done=job.iteration)))
            elif job.failure is not None and not job.stopping:
                # Failed on its own: the scheduler decides whether and when to retry it.
                effects.append(Publish(self._on(subjects.FINISHED), JobFinished(
                    job_id=job_id, node_id=self.node.node_id, iterations_done=job.iteration,
                    failure=job.failure)))
            else:
                # Stopped (or crashed): the checkpointed progress is what the next run resumes.
                effects.append(Publish(self._on(subjects.STATUS), NodeStatus(
                    node_id=self.node.node_id, cycle=job.stop_cycle,
                    progress={job_id: job.iteration})))
        if job.relaunch is not None:
            effects += self._start(*job.relaunch)
        return effects
