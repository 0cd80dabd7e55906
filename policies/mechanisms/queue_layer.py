"""The queue layer across cycles: each queue's decayed usage and each cycle's gate.

What a queue reserves in a cycle counts as held until the next cycle, which brings the usage up
to its time (`policies.mechanisms.fairshare`). The usage lives here, in the scheduler's memory:
a replay of the event log reproduces it, and a scheduler rebuilt after a crash or a failover
recomputes it from its recorded runs (`restore`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.mechanisms import fairshare
from policies.mechanisms.admission import TenantGate
from policies.mechanisms.fairshare import Usage
from policies.mechanisms.queues import QueueGate
from policies.mechanisms.quota import Book
from schemas.tenants import TenantsConfig

if TYPE_CHECKING:
    from policies.base import Fitter, Plan, Policy, Snapshot


@dataclass(frozen=True)
class _Carried:
    """What a cycle's gate leaves the next one: when it ran, whether it asked to re-plan at
    that instant, and what each queue and job reserved."""

    now: float
    wakeup_at: float | None
    reserved: Mapping[str, float]
    types: Mapping[str, str]

    @classmethod
    def of(cls, gate: QueueGate) -> _Carried:
        return cls(gate.now, gate.wakeup_at, dict(gate.reserved), dict(gate.types))


class QueueLayer:
    """The queue layer across cycles: the file's queues, their decayed usage (what each queue
    reserved in a cycle counts as held until the next), and each gate in turn."""

    def __init__(self, config: TenantsConfig) -> None:
        self.book = Book.of(config)
        self._capacity = self.book.capacity()
        self.usage = Usage()
        self._last: QueueGate | None = None  # filled in while the policy plans
        self._carried: _Carried | None = None  # or, in a fork, what it had left
        self._replanned_at: float | None = None  # the instant a gate last asked to re-plan

    def gate(self, fit: Fitter, snap: Snapshot) -> QueueGate:
        last = self._previous()
        if last is not None and last.wakeup_at == last.now:
            self._replanned_at = last.now
        held: Mapping[str, float] = {} if last is None else last.reserved
        self.usage = self.usage.advance(snap.now, held, self.book.half_life_s)
        running = {jid for jid, v in snap.jobs.items() if v.running}
        types = {} if last is None else {j: t for j, t in last.types.items() if j in running}
        inner = TenantGate(fit, snap, self.book.config, groups=self.book.queue_of,
                           capacity=self._capacity)
        self._last, self._carried = QueueGate(inner, snap, self.book, self.usage, types,
                                              may_replan=self._replanned_at != snap.now), None
        return self._last

    def usage_at(self, now: float) -> Usage:
        """The decayed usage at `now`, as the next gate will start from it (what each queue
        reserved in the last cycle held since); for reports: nothing is changed."""
        last = self._previous()
        held: Mapping[str, float] = {} if last is None else last.reserved
        return self.usage.advance(now, held, self.book.half_life_s)

    def restore(self, runs: Iterable[tuple[str, float, float, float]], now: float) -> None:
        """Usage from the recorded runs of the queues' jobs: (tenant, GPUs, from, to); runs
        of tenants in no queue are left out."""
        queue_of = self.book.queue_of
        self.usage = fairshare.from_runs(
            ((queue_of[t], g, a, b) for t, g, a, b in runs if t in queue_of), now,
            self.book.half_life_s)

    def fork(self) -> QueueLayer:
        """A copy that goes on from here without touching this one (a forecast's): the book
        shared (read only), the last gate's outcome copied, not the gate."""
        twin = copy.copy(self)
        twin._last, twin._carried = None, self._previous()
        return twin

    def _previous(self) -> _Carried | None:
        return self._carried if self._last is None else _Carried.of(self._last)


class AdmissionStep:
    """The admission step a scheduler keeps for a run with a tenants file: each cycle's gate
    (the tenant rules alone, or the queues' around them when the file has queues)."""

    def __init__(self, config: TenantsConfig) -> None:
        self.config = config
        self.queues = QueueLayer(config) if config.queues else None

    def gate(self, fit: Fitter, snap: Snapshot) -> TenantGate | QueueGate:
        if self.queues is None:
            return TenantGate(fit, snap, self.config)
        return self.queues.gate(fit, snap)

    def plan(self, policy: Policy, fit: Fitter, snap: Snapshot
             ) -> tuple[Plan, TenantGate | QueueGate]:
        """The policy's plan through this cycle's gate, woken when the gate asks too (a
        reclaim waiting for a job to come of age, a re-plan at this instant)."""
        gate = self.gate(fit, snap)
        plan = policy.plan(snap, gate)
        if gate.wakeup_at is not None:
            plan.wakeup_at = min(plan.wakeup_at or math.inf, gate.wakeup_at)
        return plan, gate

    def fork(self) -> AdmissionStep:
        """A copy for a forecast to play forward (the tenant rules keep nothing across
        cycles; the queues keep their usage and the last cycle's reservations)."""
        twin = copy.copy(self)
        twin.queues = None if self.queues is None else self.queues.fork()
        return twin


def replans_in_the_round(policy: Policy, gate: TenantGate | QueueGate, now: float) -> bool:
    """Whether a scheduler re-planning by rounds should re-plan at `now` as well: the gate asks
    to (a claim the walk left unmet, a refusal gone stale) and the policy is event-driven, run
    in rounds. A policy that plans by rounds itself (Gavel's) plans once a round: a second plan
    in the same round would share out the round's time again (and, with the queues asking
    every tick, could undo every start at the instant it was made)."""
    return gate.wakeup_at == now and policy.replan != "round"
