"""The arithmetic of queues' quotas in a cohort (Kueue's, in Loom's words; docs/queues.md).

For one resource (GPUs of any type, or one GPU type), a queue q of a cohort has a nominal
quota `n_q`, of which `lendable_q` (its lending limit, at most `n_q`; all of it without one) may
be borrowed by the others, so it keeps `kept_q = n_q - lendable_q` for itself alone. The cohort
shares a pool of `sum(lendable_q)` GPUs of quota. A queue holding `u_q` draws
`max(0, u_q - kept_q)` from the pool, and the pool is never overdrawn:

    sum over q of max(0, u_q - kept_q) <= sum over q of lendable_q

which is the same as: what the queues above their nominal quota borrow is at most the idle
lendable quota of those below it, so no queue lends beyond its lending limit. A queue holds at
most `n_q + borrowing_limit_q`. `Book` is the file's queues, indexed once per run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from schemas.job import JobSpec
from schemas.queues import ANY_TYPE, QueueSpec
from schemas.tenants import TenantsConfig


@dataclass(frozen=True)
class Book:
    config: TenantsConfig
    queue_of: Mapping[str, str]  # tenant → its queue
    members: Mapping[str, tuple[str, ...]]  # cohort → its queues, in the file's order
    half_life_s: Mapping[str, float]  # queue → its cohort's usage half-life
    # Derived numbers, asked for many times a cycle: (what, queue, resource) → GPUs.
    _memo: dict[tuple[str, str, str], int] = field(default_factory=dict, compare=False,
                                                   repr=False)

    @classmethod
    def of(cls, config: TenantsConfig) -> Book:
        queue_of = {t: q for q, spec in config.queues.items() for t in spec.tenants}
        members: dict[str, list[str]] = {}
        for q, spec in config.queues.items():
            if spec.cohort is not None:
                members.setdefault(spec.cohort, []).append(q)
        half = {q: config.cohorts[s.cohort].half_life_s
                for q, s in config.queues.items() if s.cohort is not None}
        return cls(config, queue_of, {c: tuple(m) for c, m in members.items()}, half)

    def capacity(self) -> dict[str, float]:
        """Queue → the most GPUs it may hold, borrowing included (what its tenants share)."""
        return {q: float(sum(self.most(q, r) for r in s.resources()))
                for q, s in self.config.queues.items()}

    def spec(self, queue: str) -> QueueSpec:
        return self.config.queues[queue]

    def peers(self, queue: str) -> tuple[str, ...]:
        """The queues of its cohort, itself included (itself alone without a cohort)."""
        cohort = self.spec(queue).cohort
        return (queue,) if cohort is None else self.members[cohort]

    def kept(self, queue: str, resource: str) -> int:
        """Nominal quota it never lends."""
        got = self._memo.get(("kept", queue, resource))
        if got is None:
            spec = self.spec(queue)
            got = self._memo["kept", queue, resource] = (spec.nominal_of(resource)
                                                        - spec.lendable_of(resource))
        return got

    def pool(self, queue: str, resource: str) -> int:
        """Its cohort's pool of lendable quota of `resource`."""
        got = self._memo.get(("pool", queue, resource))
        if got is None:
            got = self._memo["pool", queue, resource] = sum(
                self.spec(p).lendable_of(resource) for p in self.peers(queue))
        return got

    def pool_part(self, queue: str, resource: str, used: int) -> int:
        """What it draws from its cohort's pool when it holds `used`."""
        return max(0, used - self.kept(queue, resource))

    def most(self, queue: str, resource: str) -> int:
        """The most it can ever hold: nominal + what it may borrow from the others."""
        spec = self.spec(queue)
        nominal = spec.nominal_of(resource)
        if spec.cohort is None:
            return nominal
        others = sum(self.spec(p).lendable_of(resource) for p in self.peers(queue)
                     if p != queue)
        limit = spec.borrowing_of(resource)
        return nominal + min(others, math.inf if limit is None else limit)  # type: ignore[return-value]

    def allowed(self, queue: str, spec: JobSpec) -> tuple[str, ...]:
        """The resources a job of the queue may draw on, in the queue's order: GPUs of any
        type, or the queue's GPU types the job can run on (Kueue's flavors, tried in order)."""
        resources = self.spec(queue).resources()
        if resources == (ANY_TYPE,):
            return resources
        return tuple(r for r in resources
                     if (spec.gpu_type is None or spec.gpu_type == r)
                     and (spec.throughputs is None or spec.throughputs.get(r, 1.0) > 0))


def submit_refusal(book: Book, spec: JobSpec) -> str | None:
    """Why a job can never start under its queue's quotas (it asks for more than its queue may
    ever hold, of every GPU type it may use), or None."""
    queue = book.queue_of.get(spec.tenant)
    if queue is None:
        return None
    allowed = book.allowed(queue, spec)
    if not allowed:
        types = ", ".join(book.spec(queue).resources())
        return f"queue {queue!r} has no quota for the GPU types the job can use (it has {types})"
    most = max(book.most(queue, r) for r in allowed)
    if spec.gpus <= most:
        return None
    return (f"asks for {spec.gpus} GPUs; queue {queue!r} may hold at most {most} "
            "(nominal quota and what it may borrow)")
