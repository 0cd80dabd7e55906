"""The placer service's core: binds each plan to nodes and guards the GPU inventory.

It keeps who holds every GPU, applies a plan's stops before its launches, refuses any launch
onto a GPU someone else holds (a double booking is a bug upstream, never silently accepted)
and tells each node agent exactly what to start and stop. Jobs that interleave (Muri) share
GPUs by design: a GPU may be held by several jobs only if they are one declared group.
A refused plan changes nothing: the whole plan is checked before any of it is applied.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.events import (
    STOP_GANG_FAILED,
    STOP_GANG_FINISHED,
    Envelope,
    GpuSlots,
    JobFinished,
    Launch,
    NodeCommand,
    PlanDecided,
    Stop,
)
from services.placer.refusals import DoubleBooking, HeldByAnother, StaleTerm, StillBound
from services.runtime.effects import Effect, Publish
from services.runtime.service import CoreDefaults, Subscribe
from services.runtime.trusted import trusted

Gpu = tuple[str, int]


APPLIED_MEMORY = 4096  # plans remembered by event id, against re-deliveries
COMPLETED_MEMORY = 65536  # jobs remembered as completed, against plans decided before it


class PlacerCore(CoreDefaults):
    name = "placer"

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self._size = {n.node_id: n.gpus for n in cluster.nodes}
        self._rank = {n.node_id: i for i, n in enumerate(cluster.nodes)}  # command order
        self._held: dict[str, dict[str, int]] = {n: {} for n in self._rank}  # node → job → mask
        self.bound: dict[str, GpuSlots] = {}
        self.term = 0  # the newest scheduler term seen: older plans are refused (fencing)
        # Bounded memories, oldest first: OrderedDict forgets its oldest in O(1), where a dict
        # scans past every key deleted before it.
        self._applied: OrderedDict[str, None] = OrderedDict()  # the latest plans bound
        # Jobs whose trainer reported completion. A plan the scheduler made before that
        # report may still launch one (plans and finishes reach the placer on separate
        # consumers); its node would never run it again, so binding it would hold GPUs for ever.
        self._completed: OrderedDict[str, None] = OrderedDict()
        # Every node a job not yet completed was bound to: only those may report its end.
        self._hosts: dict[str, frozenset[str]] = {}

    @property
    def owner(self) -> dict[Gpu, set[str]]:
        """Who holds each GPU (a view for inspection; bookkeeping is per node, as bitmasks)."""
        out: dict[Gpu, set[str]] = {}
        for node, jobs in self._held.items():
            for job, mask in jobs.items():
                for i in range(self._size[node]):
                    if mask >> i & 1:
                        out.setdefault((node, i), set()).add(job)
        return out

    def subscriptions(self) -> Sequence[Subscribe]:
        return (Subscribe(subjects.PLAN_DECIDED), Subscribe(subjects.JOB_FINISHED))

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        body = env.body
        if isinstance(body, PlanDecided):
            if env.event_id in self._applied:
                return []  # re-delivered (an acknowledgement was lost): already bound
            effects = self._bind(body)
            self._applied[env.event_id] = None
            if len(self._applied) > APPLIED_MEMORY:
                self._applied.popitem(last=False)
            return effects
        if isinstance(body, JobFinished):
            return self._finished(body)
        raise TypeError(f"placer does not handle {env.type}")

    def _release(self, job_id: str) -> GpuSlots:
        slots = self.bound.pop(job_id, ())
        for node, _ in slots:
            self._held[node].pop(job_id, None)
        return slots

    def _bind(self, plan: PlanDecided) -> list[Effect]:
        if plan.term < self.term:
            raise StaleTerm(f"plan of cycle {plan.cycle} has term {plan.term}; "
                            f"the leader's term is {self.term}")
        self.term = plan.term
        if any(x.job_id in self._completed for x in plan.launches):
            plan = plan.model_copy(update={"launches": tuple(
                x for x in plan.launches if x.job_id not in self._completed)})
        masks = self._validate(plan)  # all or nothing: a refused plan changes no state
        stops: dict[str, list[Stop]] = {}
        launches: dict[str, list[Launch]] = {}
        for stop in plan.stops:
            for node, _ in self._release(stop.job_id):
                stops.setdefault(node, []).append(stop)
        for launch, per_node in zip(plan.launches, masks, strict=True):
            for node, mask in per_node:
                self._held[node][launch.job_id] = mask
                launches.setdefault(node, []).append(launch)
            self.bound[launch.job_id] = launch.placement
            self._hosts[launch.job_id] = self._hosts.get(launch.job_id, frozenset()).union(
                n for n, _ in launch.placement)
        return self._commands(plan.cycle, stops, launches, plan.term)

    def _validate(self, plan: PlanDecided) -> list[list[tuple[str, int]]]:
        """Check every launch; returns each launch's (node, GPU mask) list."""
        stopping = {s.job_id for s in plan.stops}
        claimed: dict[str, dict[str, int]] = {}  # node → job launched in this plan → mask
        out: list[list[tuple[str, int]]] = []
        for launch in plan.launches:
            job = launch.job_id
            allowed = set(launch.colocated) | {job}
            if job in self.bound and job not in stopping:
                raise StillBound(f"job {job} launched while still bound")
            per_node: list[tuple[str, int]] = []
            for node, gpus in launch.placement:
                size = self._size.get(node)
                if size is None:
                    raise DoubleBooking(f"job {job}: unknown node {node!r}")
                if any(n == node for n, _ in per_node):
                    nodes = [n for n, _ in launch.placement]
                    raise DoubleBooking(f"job {job}: placement names a node twice: {nodes}")
                mask = 0
                for i in gpus:
                    if not 0 <= i < size:
                        raise DoubleBooking(f"job {job}: node {node} has no GPU {i}")
                    if mask >> i & 1:
                        raise DoubleBooking(f"job {job}: node {node} GPU listed twice: {gpus}")
                    mask |= 1 << i
                for holders, skip in ((self._held[node], stopping), (claimed.get(node, {}), ())):
                    for holder, hmask in holders.items():
                        if hmask & mask and holder not in allowed and holder not in skip:
                            i = (hmask & mask & -(hmask & mask)).bit_length() - 1
                            raise HeldByAnother(
                                f"job {job}: GPU {node}:{i} is held by job {holder}")
                claimed.setdefault(node, {})[job] = mask
                per_node.append((node, mask))
            out.append(per_node)
        return out

    def _finished(self, msg: JobFinished) -> list[Effect]:
        if msg.job_id in self._completed:
            return []  # a duplicate, or a gang member's report after its leader's
        hosts = self._hosts.get(msg.job_id)
        if hosts is not None and msg.node_id not in hosts:  # (None: bound before a restart)
            raise ValueError(f"node {msg.node_id} reports the end of job {msg.job_id!r}, "
                             f"which was never bound there (bound to: {', '.join(sorted(hosts))})")
        bound = self.bound.get(msg.job_id, ())
        if msg.failure is not None and bound and all(n != msg.node_id for n, _ in bound):
            return []  # a failure of a run the job has left: the scheduler ignores it too
        slots = self._release(msg.job_id)
        if msg.failure is None:  # completed (a failed one may be retried by a later plan)
            self._completed[msg.job_id] = None
            self._hosts.pop(msg.job_id, None)
            if len(self._completed) > COMPLETED_MEMORY:
                self._completed.popitem(last=False)
        # A failed run's job may be retried, on these nodes too: not "finished" for them.
        stop = trusted(Stop, job_id=msg.job_id,
                       reason=STOP_GANG_FINISHED if msg.failure is None else STOP_GANG_FAILED)
        # The node that reported already stopped it; the other nodes of a gang must too.
        others = {node: [stop] for node, _ in slots if node != msg.node_id}
        return self._commands(-1, others, {}, self.term)

    def _commands(
        self, cycle: int, stops: dict[str, list[Stop]], launches: dict[str, list[Launch]],
        term: int,
    ) -> list[Effect]:
        out: list[Effect] = []
        for node in sorted(stops.keys() | launches.keys(), key=self._rank.__getitem__):
            s, lch = stops.get(node), launches.get(node)
            if s or lch:
                out.append(Publish(subjects.node_command(node), trusted(
                    NodeCommand,
                    node_id=node, cycle=cycle, stops=tuple(s or ()), launches=tuple(lch or ()),
                    term=term)))
        return out
