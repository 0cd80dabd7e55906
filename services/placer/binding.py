"""The placer service's core: binds each plan to nodes and guards the GPU inventory.

It keeps who holds every GPU, applies a plan's stops before its launches, refuses any launch
onto a GPU someone else holds (a double booking is a bug upstream, never silently accepted)
and tells each node agent exactly what to start and stop. Jobs that interleave (Muri) share
GPUs by design: a GPU may be held by several jobs only if they are one declared group.
A refused plan changes nothing: the whole plan is checked before any of it is applied.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.events import Envelope, GpuSlots, JobFinished, Launch, NodeCommand, PlanDecided, Stop
from services.runtime.effects import Effect, Publish
from services.runtime.service import CoreDefaults, Subscribe

Gpu = tuple[str, int]


class DoubleBooking(RuntimeError):
    pass


class PlacerCore(CoreDefaults):
    name = "placer"

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self._size = {n.node_id: n.gpus for n in cluster.nodes}
        self._order = [n.node_id for n in cluster.nodes]
        self.owner: dict[Gpu, set[str]] = {}  # jobs holding each GPU
        self.bound: dict[str, GpuSlots] = {}

    def subscriptions(self) -> Sequence[Subscribe]:
        return (Subscribe(subjects.PLAN_DECIDED), Subscribe(subjects.JOB_FINISHED))

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        body = env.body
        if isinstance(body, PlanDecided):
            return self._bind(body)
        if isinstance(body, JobFinished):
            return self._finished(body)
        raise TypeError(f"placer does not handle {env.type}")

    def _release(self, job_id: str) -> GpuSlots:
        slots = self.bound.pop(job_id, ())
        for node, gpus in slots:
            for i in gpus:
                holders = self.owner.get((node, i))
                if holders is not None:
                    holders.discard(job_id)
                    if not holders:
                        del self.owner[(node, i)]
        return slots

    def _bind(self, plan: PlanDecided) -> list[Effect]:
        self._validate(plan)  # all or nothing: a refused plan changes no state
        stops: dict[str, list[Stop]] = {}
        launches: dict[str, list[Launch]] = {}
        for stop in plan.stops:
            for node, _ in self._release(stop.job_id):
                stops.setdefault(node, []).append(stop)
        for launch in plan.launches:
            for node, gpus in launch.placement:
                for i in gpus:
                    self.owner.setdefault((node, i), set()).add(launch.job_id)
                launches.setdefault(node, []).append(launch)
            self.bound[launch.job_id] = launch.placement
        return self._commands(plan.cycle, stops, launches)

    def _validate(self, plan: PlanDecided) -> None:
        stopping = {s.job_id for s in plan.stops}
        claimed: dict[Gpu, set[str]] = {}
        for launch in plan.launches:
            job = launch.job_id
            allowed = set(launch.colocated) | {job}
            if job in self.bound and job not in stopping:
                raise DoubleBooking(f"job {job} launched while still bound")
            nodes = [node for node, _ in launch.placement]
            if len(set(nodes)) != len(nodes):
                raise DoubleBooking(f"job {job}: placement names a node twice: {nodes}")
            for node, gpus in launch.placement:
                size = self._size.get(node)
                if size is None:
                    raise DoubleBooking(f"job {job}: unknown node {node!r}")
                if len(set(gpus)) != len(gpus):
                    raise DoubleBooking(f"job {job}: node {node} GPU listed twice: {gpus}")
                for i in gpus:
                    if not 0 <= i < size:
                        raise DoubleBooking(f"job {job}: node {node} has no GPU {i}")
                    gpu = (node, i)
                    held = [h for h in self.owner.get(gpu, ()) if h not in stopping]
                    mates = claimed.setdefault(gpu, set())
                    for holder in (*held, *mates):
                        if holder not in allowed:
                            raise DoubleBooking(
                                f"job {job}: GPU {node}:{i} is held by job {holder}")
                    mates.add(job)

    def _finished(self, msg: JobFinished) -> list[Effect]:
        slots = self._release(msg.job_id)
        stop = Stop(job_id=msg.job_id, reason="finished")
        # The node that reported already stopped it; the other nodes of a gang must too.
        others = {node: [stop] for node, _ in slots if node != msg.node_id}
        return self._commands(-1, others, {})

    def _commands(
        self, cycle: int, stops: dict[str, list[Stop]], launches: dict[str, list[Launch]]
    ) -> list[Effect]:
        out: list[Effect] = []
        for node in self._order:
            s, lch = stops.get(node), launches.get(node)
            if s or lch:
                out.append(Publish(subjects.node_command(node), NodeCommand(
                    node_id=node, cycle=cycle, stops=tuple(s or ()), launches=tuple(lch or ()))))
        return out
