"""The simulated nodes of a run as one service: a fleet of `SimNode`s that takes each cycle once.

Each simulated node charges its running jobs a per-event cost at every scheduling cycle (see
`services.nodeagent.simnode`). As one service per node, a cycle was a bus delivery, a core
call and a reservation of same-instant places for every node that ran a charged job: about
eleven deliveries per event on 2,560 GPUs. The fleet takes the cycle once, logs it once for
all its nodes, and reserves one block of places for every charged run of every node, in node
order: the places the nodes' own reservations took, one after the other, when each node was
a service subscribed in that order. A node's offset into the block is the count of charged
runs on the nodes before it at that cycle, a prefix sum (`_Counts`); counts that change
between cycles are filed at the next one. Every `CATCH_UP_CYCLES` cycles the fleet charges
every run what it owes and moves its timer, in the block's order, which bounds the log.

Each node keeps its own subjects, command gate, event ids and producer name (`nodeagent-<id>`),
so the bus, the event log and every other service see the same messages as from one service
per node. `SimNodeCore` is a fleet of one node: the service `loom serve` runs per node.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from domain.overhead import OverheadModel
from domain.progress import CATCH_UP_CYCLES
from schemas import subjects
from schemas.cluster import NodeSpec
from schemas.events import CycleStarted, Envelope, JobFinished, NodeCommand
from schemas.throughputs import ThroughputTable
from services.nodeagent.gate import CommandGate
from services.nodeagent.simnode import CycleLog, NodeRun, SimNode
from services.runtime.bus import Interest
from services.runtime.effects import PRIORITY_INPUT, Effect, ReserveOrder, SetTimers
from services.runtime.logging import get_logger
from services.runtime.service import CoreDefaults, Recorded, Subscribe

log = get_logger("loom.nodeagent")


class _Counts:
    """A count per node with sums over the nodes before one (a Fenwick tree): O(log n)."""

    def __init__(self, size: int) -> None:
        self._tree = [0] * (size + 1)
        self.total = 0

    def add(self, i: int, delta: int) -> None:
        self.total += delta
        tree, i = self._tree, i + 1
        while i < len(tree):
            tree[i] += delta
            i += i & -i

    def before(self, i: int) -> int:
        tree, total = self._tree, 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


class SimFleetCore(CoreDefaults):
    def __init__(self, nodes: Sequence[NodeSpec], overhead: OverheadModel,
                 profile: ThroughputTable | None = None, *, name: str = "simnodes") -> None:
        self.name = name
        self.overhead = overhead
        self.cycles = CycleLog()
        self.members = [SimNode(node, overhead, profile, self.cycles) for node in nodes]
        self._index = {m.node_id: i for i, m in enumerate(self.members)}
        if len(self._index) != len(self.members):
            raise ValueError(f"fleet {name}: a node id appears twice")
        self._counts = _Counts(len(self.members))  # charged runs per node at the last cycle
        self._now = [0] * len(self.members)  # charged runs per node now
        self._charging = 0  # their sum
        self._changed: dict[int, SimNode] = {}  # nodes whose charged runs changed since
        self._cycles = Interest()  # on while some run is charged

    def subscriptions(self) -> Sequence[Subscribe]:
        commands = [Subscribe(subjects.node_command(m.node_id)) for m in self.members]
        # Cycle announcements only matter where an interruption costs time; without that a
        # cycle changes nothing here.
        if not self.overhead.charges_per_event:
            return commands
        return (*commands, Subscribe(subjects.CYCLE_STARTED, wants=self._cycles))

    def history_subjects(self) -> Sequence[str]:
        owned = [s for m in self.members for s in (
            subjects.node_command(m.node_id), subjects.node_subject(m.node_id, subjects.FINISHED))]
        return (*owned, *([subjects.CYCLE_STARTED] if self.overhead.charges_per_event else []))

    def rebuild(self, history: Sequence[Recorded], now: float) -> list[Effect]:
        """A node is deterministic in its commands (with the time they were sent): replay
        them and the cycles with the effects dropped (they were carried out), forget the jobs
        each node reported finished, and re-arm the finish timers of the rest."""
        wanted = [s.subject for s in self.subscriptions()]
        for rec in history:
            body = rec.env.body
            if isinstance(body, JobFinished):
                i = self._index.get(body.node_id)
                if i is not None and rec.subject == subjects.node_subject(body.node_id,
                                                                           subjects.FINISHED):
                    member = self.members[i]
                    member.drop(body.job_id)
                    if body.failure is None:  # a failed run's job may run here again
                        member.gate.finish(body.job_id)
                    self._noted(i, member)
            elif any(subjects.matches(w, rec.subject) for w in wanted):
                if isinstance(body, NodeCommand) and body.node_id not in self._index:
                    continue
                self.handle(rec.env, rec.env.occurred_at)
        effects: list[Effect] = []
        for member in self.members:
            for run in member.jobs.values():
                if run.leader:
                    member.catch_up(run)
                    run.advance(now, interrupted=False)
                    effects.append(run.finish_timer(now))
        log.info("node agents rebuilt", service=self.name, nodes=len(self.members),
                 jobs=sum(len(m.jobs) for m in self.members))
        return effects

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        body = env.body
        if isinstance(body, CycleStarted):
            return self._on_cycle(now)
        if isinstance(body, NodeCommand):
            i = self._index.get(body.node_id)
            if i is None:
                raise ValueError(f"a command for node {body.node_id!r}, which {self.name} "
                                 "does not run")
            member = self.members[i]
            cmd = member.gate.admit(body)
            if cmd is None:
                return []
            effects = member.on_command(cmd, now)
            self._noted(i, member)
            return effects
        raise TypeError(f"node agent does not handle {env.type}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        assert isinstance(key, tuple) and key[0] == "finish"
        i = self._index[key[1]]
        member = self.members[i]
        effects = member.on_finish_timer(key[2], self._counts.before(i))
        self._noted(i, member)
        return effects

    def _noted(self, i: int, member: SimNode) -> None:
        """File a change of `member`'s charged runs: its count now, and, for the next cycle,
        its place in the block."""
        if member.order is not member.cycle_order:
            self._changed[i] = member
        n = len(member.order)
        if n != self._now[i]:
            self._charging += n - self._now[i]
            self._now[i] = n
            self._cycles.set(self._charging > 0)

    def _on_cycle(self, now: float) -> list[Effect]:
        # Every charged run's interval closes and its finish timer moves: logged, with the
        # places of the re-arms reserved, or all caught up.
        if not self._charging:  # without a per-event charge nothing changes: the timers stand
            return []
        counts = self._counts
        for i, member in self._changed.items():
            counts.add(i, len(member.order) - len(member.cycle_order))
            member.cycle_order = member.order
        self._changed.clear()
        self.cycles.log(now)
        if len(self.cycles.times) < CATCH_UP_CYCLES:
            return [ReserveOrder(counts.total)]
        runs: list[NodeRun] = []
        for member, n in zip(self.members, self._now, strict=True):
            if n:
                runs += [member.jobs[j] for j in member.order]
        self.cycles.charge_all(runs)
        timers: list[tuple[Hashable, float]] = [
            (run.key, run.progress.finish_at(run.progress.at, run.fail_at)) for run in runs]
        self.cycles.times.clear()
        return [SetTimers(timers, PRIORITY_INPUT)]


class SimNodeCore(SimFleetCore):
    """One simulated node as its own service, `nodeagent-<id>`."""

    def __init__(self, node: NodeSpec, overhead: OverheadModel,
                 profile: ThroughputTable | None = None) -> None:
        super().__init__((node,), overhead, profile, name=f"nodeagent-{node.node_id}")
        self.node = node

    @property
    def jobs(self) -> dict[str, NodeRun]:
        return self.members[0].jobs

    @property
    def gate(self) -> CommandGate:
        return self.members[0].gate
