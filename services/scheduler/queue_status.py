"""The queues as operators see them (`loom queues`, the `loom_queue_*` series): a pure function
of the scheduler's state and `now`, and when the scheduler publishes it.

- `queue_status(core, now)`: every queue's quota per resource, the GPUs its running jobs hold,
  what it borrows and lends, its waiting jobs with their reasons (as `loom status` gives
  them), and its decayed usage and rank for borrowed GPUs. Reads the job table, the queue
  layer and the last cycle's gate; changes nothing.
- `after_cycle(core, now)`: with `queue_status_every_s` set (a live scheduler), the status
  after a cycle, published on `loom.sched.queues` when it differs from the last one published
  or that one is `queue_status_every_s` old (decayed usage changes with every cycle; the rest
  only when jobs move). An observation: no core consumes it, replay skips it, the decision
  digest leaves it out, so publishing it never changes a decision.

Lending: the pool arithmetic (`policies.mechanisms.quota`) says how much a cohort's queues
borrow in all, not from whom. `lent` splits that total between the queues below their nominal
quota in proportion to the idle quota each may lend (largest remainder, ties to the file's
order), so a cohort's `lent` adds up to its `borrowed`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.mechanisms.fairshare import Usage, factors, order_key
from policies.mechanisms.quota import Book
from schemas import subjects
from schemas.events import gpu_count
from schemas.queue_status import (
    CohortState,
    QueueState,
    QueueStatus,
    QuotaUsage,
    Unqueued,
    WaitCount,
)
from schemas.queues import ANY_TYPE
from schemas.status import StatusCode
from services.runtime.effects import Effect, Publish
from services.scheduler import queries
from services.scheduler.jobs import JobRecord

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore

PART = 200  # queues per published message: well under the 1 MiB event limit
Key = tuple[str, str]  # (queue, resource)


@dataclass
class Published:
    """The last status published: when, and what it said (less its time and usage)."""

    at: float | None = None
    shown: tuple[object, ...] | None = None


def queue_status(core: SchedulerCore, now: float) -> QueueStatus:
    """The queue layer as of `now` (see module docstring)."""
    step = core.admission
    layer = None if step is None else step.queues
    if step is None or layer is None:
        return QueueStatus(at=now, cycle=core.cycle, tenants_file=step is not None)
    book = layer.book
    used, running, outside_used, outside_running = _held(core, book)
    pending, pending_gpus, waits, outside_pending = _waiting(core, book)
    usage = layer.usage_at(now)
    lent = _lent(book, used)
    standing = _standing(book, usage)
    rows = []
    for name, spec in book.config.queues.items():
        quotas = []
        for r in spec.resources():
            u = used[name, r]
            quotas.append(QuotaUsage(
                gpu_type=r, nominal=spec.nominal_of(r), borrowing_limit=spec.borrowing_of(r),
                lending_limit=None if spec.lending_limit is None else spec.lendable_of(r),
                used=u, borrowed=max(0, u - spec.nominal_of(r)), lent=lent[name, r]))
        rows.append(QueueState(
            name=name, cohort=spec.cohort, tenants=spec.tenants, weight=spec.weight,
            priority=spec.priority, reclaim=spec.reclaim, min_runtime_s=spec.min_runtime_s,
            quotas=tuple(quotas), running_jobs=running[name], pending_jobs=pending[name],
            pending_gpus=pending_gpus[name], usage_gpu_s=usage.of(name),
            rank=standing.get(name, (None, 1.0))[0],
            share_factor=standing.get(name, (None, 1.0))[1],
            waiting=_counts(waits.get(name, ()))))
    cohorts = tuple(CohortState(name=c, half_life_s=book.config.cohorts[c].half_life_s,
                                queues=book.members.get(c, ()))
                    for c in book.config.cohorts)
    return QueueStatus(at=now, cycle=core.cycle, tenants_file=True, cohorts=cohorts,
                       queues=tuple(rows),
                       unqueued=Unqueued(running_jobs=outside_running, used_gpus=outside_used,
                                         pending_jobs=outside_pending))


def after_cycle(core: SchedulerCore, now: float) -> list[Effect]:
    """The status after the cycle at `now`, published when due (see module docstring)."""
    every = core.config.queue_status_every_s
    step = core.admission
    if every is None or step is None or step.queues is None:
        return []
    status = queue_status(core, now)
    shown = _shown(status)
    last = core.queue_reports
    if last.shown == shown and last.at is not None and now < last.at + every:
        return []
    last.at, last.shown = now, shown
    return [Publish(subjects.QUEUE_STATUS, part) for part in split(status)]


def split(status: QueueStatus, per: int = PART) -> list[QueueStatus]:
    """The status as messages of at most `per` queues each (cohorts and `unqueued` in the
    first)."""
    queues = status.queues
    parts = max(1, -(-len(queues) // per))
    if parts == 1:
        return [status]
    return [status.model_copy(update={
        "queues": queues[i * per:(i + 1) * per], "part": i, "parts": parts,
        "cohorts": status.cohorts if i == 0 else (),
        "unqueued": status.unqueued if i == 0 else None}) for i in range(parts)]


# -- the parts ------------------------------------------------------------------------------
def _resource(book: Book, queue: str, rec: JobRecord, type_of: Mapping[str, str]) -> str:
    """The resource a running job counts against, as the gate counts it: GPUs of any type,
    or the type of the GPUs it runs on (else the first of its queue's types it may use)."""
    resources = book.spec(queue).resources()
    if resources == (ANY_TYPE,):
        return ANY_TYPE
    seen = type_of.get(rec.placement[0][0]) if rec.placement else None
    if seen in resources:
        return seen
    allowed = book.allowed(queue, rec.spec)
    return allowed[0] if allowed else resources[0]


def _held(core: SchedulerCore, book: Book) -> tuple[Counter[Key], Counter[str], int, int]:
    """GPUs held per (queue, resource) and running jobs per queue; the same outside queues."""
    used: Counter[Key] = Counter()
    running: Counter[str] = Counter()
    outside_used = outside_running = 0
    type_of = core.topology.type_of
    for rec in core.jobs.running.values():
        gpus = gpu_count(rec.placement)
        q = book.queue_of.get(rec.spec.tenant)
        if q is None:
            outside_used += gpus
            outside_running += 1
            continue
        used[q, _resource(book, q, rec, type_of)] += gpus
        running[q] += 1
    return used, running, outside_used, outside_running


def _waiting_jobs(core: SchedulerCore) -> list[JobRecord]:
    """Every job waiting now, in admission order: those the policy sees, those an operator
    suspended, and those backing off after a failure."""
    ids = {jid for jid, view in core.views.items() if not view.running}
    ids |= core.jobs.held
    ids |= set(core.faults.backoff)
    recs = [core.jobs[jid] for jid in ids if jid in core.jobs]
    return sorted((r for r in recs if r.state is not None and r.state.waiting),
                  key=lambda r: r.admitted)


def _waiting(core: SchedulerCore, book: Book
             ) -> tuple[Counter[str], Counter[str], dict[str, list[tuple[str, str, StatusCode]]],
                        int]:
    """Waiting jobs and their GPUs per queue, each job's (id, reason, code) per queue, and
    the waiting jobs of tenants in no queue."""
    jobs: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    why: dict[str, list[tuple[str, str, StatusCode]]] = {}
    outside = 0
    for rec in _waiting_jobs(core):
        q = book.queue_of.get(rec.spec.tenant)
        if q is None:
            outside += 1
            continue
        jobs[q] += 1
        gpus[q] += rec.spec.gpus
        status = queries.status(core, rec.spec.job_id)
        why.setdefault(q, []).append((rec.spec.job_id, status.reason, status.code))
    return jobs, gpus, why, outside


def _counts(waits: Iterable[tuple[str, str, StatusCode]]) -> tuple[WaitCount, ...]:
    """Per code: how many, and the first job (admission order) with its reason; codes with
    the most jobs first, then by code."""
    first: dict[StatusCode, tuple[str, str]] = {}
    n: Counter[StatusCode] = Counter()
    for jid, reason, code in waits:
        n[code] += 1
        first.setdefault(code, (jid, reason))
    return tuple(WaitCount(code=c, jobs=n[c], job_id=first[c][0], reason=first[c][1][:2048])
                 for c in sorted(n, key=lambda c: (-n[c], c.value)))


def _lent(book: Book, used: Mapping[Key, int]) -> Counter[Key]:
    """Each lender's share of what its cohort borrows (see module docstring)."""
    out: Counter[Key] = Counter()
    for members in book.members.values():
        resources = dict.fromkeys(r for q in members for r in book.spec(q).resources())
        for r in resources:
            borrowed = sum(max(0, used[q, r] - book.spec(q).nominal_of(r)) for q in members)
            idle = {q: min(book.spec(q).lendable_of(r),
                           max(0, book.spec(q).nominal_of(r) - used[q, r])) for q in members}
            for q, share in apportion(min(borrowed, sum(idle.values())), idle).items():
                out[q, r] = share
    return out


def apportion(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """`total` split in proportion to `weights` in whole numbers that add up to it (largest
    remainder; ties to the earlier key). `total` is at most the sum of the weights, so no
    share exceeds its weight."""
    whole = sum(weights.values())
    if total <= 0 or whole <= 0:
        return {k: 0 for k in weights}
    shares = {k: total * w // whole for k, w in weights.items()}
    order = sorted(weights, key=lambda k: -(total * weights[k] % whole))  # stable: file order
    for k in order[:total - sum(shares.values())]:
        shares[k] += 1
    return shares


def _standing(book: Book, usage: Usage) -> dict[str, tuple[int | None, float]]:
    """Each queue's 1-based place in its cohort's order for borrowed GPUs (priority, then
    decayed usage per weight, then name; None without a cohort) and Slurm's fair-share
    factor among its cohort's queues (1.0 alone)."""
    out: dict[str, tuple[int | None, float]] = {}
    for members in book.members.values():
        order = sorted(members, key=lambda q: order_key(q, usage.of(q), book.spec(q).weight,
                                                        book.spec(q).priority))
        share = factors({q: usage.of(q) for q in members},
                        {q: book.spec(q).weight for q in members})
        out.update((q, (i + 1, share[q])) for i, q in enumerate(order))
    return out


def _shown(status: QueueStatus) -> tuple[object, ...]:
    """What a status says that jobs moving change: all but its time and usage figures."""
    rows = [(q.name, q.quotas, q.running_jobs, q.pending_jobs, q.pending_gpus, q.waiting, q.rank)
            for q in status.queues]
    return (*rows, status.unqueued)
