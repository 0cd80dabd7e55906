"""Queues in front of every policy: nominal quotas, borrowing within a cohort, reclaim.

The policy orders and sizes jobs; this layer decides which queue may hold which GPUs. Like the
tenant step (`policies.mechanisms.admission`) it is the policy's `Fitter`, wrapping the tenant
gate, which wraps the placer's: a reservation it refuses leaves the job waiting with a status
saying why. It is on only when the tenants file has `[queues.*]`; without them every decision
is what it was before queues existed. For a job of queue q asking for g more GPUs of a resource
(GPUs of any type, or a GPU type when the queue's quotas are per type; `policies.mechanisms.
quota` has the arithmetic):

- Within its nominal quota (`u_q + g <= n_q`) it may always start, once the pool has the room:
  if q lent that quota out, the borrowers' jobs are reclaimed first (`waiting_for_reclaim`
  until then).
- Beyond it, q borrows: not without a cohort (`waiting_for_queue_quota`), not past its
  borrowing limit (`borrowing_limit`), and only from quota the cohort's pool has idle, less what
  other queues' jobs waiting within their own nominal quota will take (`waiting_for_quota_in_
  cohort`; `lending_limit` when idle quota exists but lending limits keep it from borrowers).
- Contended pool GPUs go to queues in order of priority, then decayed usage per weight
  (`policies.mechanisms.fairshare`): q may not borrow what queues ranked before it want to
  borrow for their waiting jobs (`waiting_for_fair_share`).

Reclaim: when the cycle starts, each queue with jobs waiting within its nominal quota that the
pool cannot hold takes its lent quota back, choosing victims among borrowers' running jobs
(`policies.mechanisms.reclaim`). The gate refuses to re-reserve them (`reclaimed_by_queue`), so
the policy drops them and the scheduler preempts them, with the cause "preempted: reclaimed by
queue 'x'". Otherwise a running job keeps its GPUs unless jobs of its own queue that the
policy ranked first took its queue's room: a queue that borrowed keeps what it holds until a
lender asks for it back, and no other queue takes it by being walked first.

The layer across cycles (decayed usage, the admission step a scheduler keeps) is
`policies.mechanisms.queue_layer`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from policies.mechanisms.admission import FitterGate, TenantGate
from policies.mechanisms.fairshare import Usage, order_key
from policies.mechanisms.quota import Book
from policies.mechanisms.reclaim import Candidate, choose, may_reclaim
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.queues import ANY_TYPE
from schemas.status import Status, StatusCode

if TYPE_CHECKING:
    from policies.base import JobView, Snapshot

DECIDED_BY = "queues"
Key = tuple[str, str]  # (queue, resource)


class QueueGate(FitterGate):
    """The policy's fitter for one cycle under the queues' rules (see module docstring)."""

    _inner: TenantGate

    def __init__(self, inner: TenantGate, snap: Snapshot, book: Book, usage: Usage,
                 types: Mapping[str, str], may_replan: bool = True) -> None:
        super().__init__(inner)
        self.now = snap.now
        self._may_replan = may_replan
        self._book = book
        self._usage = usage
        self._specs = {jid: v.spec for jid, v in snap.jobs.items()}
        self._node_type = {n.node_id: n.gpu_type for n in snap.cluster.nodes}
        # The most each queue may hold of each resource when the cycle ends: what it held as
        # it began (less reclaim victims), grown only by reservations the rules allowed. Its
        # running jobs count in it until the walk re-reserves them, so no other queue takes
        # their GPUs; its own jobs may (the policy ranked them first), and a running job of
        # it walked after them must then fit in what is left, or be refused and preempted.
        self.used: Counter[Key] = Counter()
        self._holds: Counter[Key] = Counter()  # reserved in this walk, running jobs included
        self._kept: dict[str, tuple[str, int]] = {}  # running job → (resource, GPUs)
        # GPUs of each queue's running jobs the walk has not re-reserved yet (nor reclaimed).
        self._unwalked: Counter[Key] = Counter()
        self._since: dict[str, float] = {}  # running job → when its run began
        self._waiting: dict[str, Counter[tuple[str, int]]] = {}  # queue → (resource, size) → jobs
        self._hint: dict[str, str] = {}  # waiting job → the resource it counts against
        self.held: dict[str, Status] = {}
        self.reclaimed: dict[str, str] = {}  # victim → the queue taking its GPUs back
        self._reclaim_at: float | None = None  # when a job kept from reclaim comes of age
        self.reserved: Counter[str] = Counter()  # queue → GPUs reserved this cycle
        self.types: dict[str, str] = {}  # job → the GPU type it was reserved on
        # Refusals since the last reservation, by (queue, resource, GPUs): nothing they
        # depend on changes in between, and a long queue asks the same question many times.
        self._asked: dict[tuple[str, str, int], Status | None] = {}
        running = []
        for jid, view in snap.jobs.items():
            q = book.queue_of.get(view.spec.tenant)
            if q is None:
                continue
            if view.running:
                r = self._running_resource(q, view.spec, types.get(jid))
                self.used[q, r] += view.allocated
                self._kept[jid] = (r, view.allocated)
                self._unwalked[q, r] += view.allocated
                self._since[jid] = view.run_since if view.run_since is not None else snap.now
                running.append(view)
        for jid, view in snap.jobs.items():  # hints need the running jobs counted first
            q = book.queue_of.get(view.spec.tenant)
            if q is not None and not view.running:
                r = self._hint[jid] = self._waiting_resource(q, view.spec)
                self._waiting.setdefault(q, Counter())[r, view.gpus] += 1
        self._reclaim(snap, running)

    def try_place(self, job_id: str, gpus: int, gpu_type: str | None = None,
                  within: Collection[str] | None = None) -> GpuSlots | None:
        self._last_refusal = None
        spec = self._specs[job_id]
        q = self._book.queue_of.get(spec.tenant)
        if q is None:  # a tenant in no queue: the tenant rules alone
            slots = self._inner.try_place(job_id, gpus, gpu_type, within)
            if slots is not None:
                self._asked.clear()  # the cluster is no longer idle
            return slots
        if job_id in self.reclaimed:
            self._last_refusal = self.held[job_id].reason
            return None
        kept_r, kept = self._kept.get(job_id, ("", 0))
        typed = self._book.spec(q).typed
        if kept:
            options: tuple[str, ...] = (kept_r,)
        else:
            options = tuple(r for r in self._book.allowed(q, spec)
                            if gpu_type is None or r in (gpu_type, ANY_TYPE))
        first: Status | None = None
        unplaced = False
        for r in options:
            extra = self._holds[q, r] + gpus - self.used[q, r]  # beyond what q may hold now
            refusal = None if extra <= 0 else self.refusal(q, r, extra)
            if refusal is not None:
                first = first or refusal
                continue
            slots = self._inner.try_place(job_id, gpus, r if typed else gpu_type, within)
            if slots is not None:
                self._took(job_id, q, r, gpus, slots)
                return slots
            unplaced = True
        if unplaced:
            return None  # the quota allowed it where it did not fit: the placer says why
        if first is None:
            first = Status(code=StatusCode.WAITING_FOR_QUEUE_QUOTA, decided_by=DECIDED_BY,
                           reason=f"queue {q!r} has no quota for the GPU types the job can use")
        self.held[job_id] = first
        self._last_refusal = first.reason
        return None

    def _took(self, job_id: str, q: str, r: str, gpus: int, slots: GpuSlots) -> None:
        self.held.pop(job_id, None)
        _, kept = self._kept.pop(job_id, (r, 0))
        self._unwalked[q, r] -= kept
        self._holds[q, r] += gpus
        self.used[q, r] = max(self.used[q, r], self._holds[q, r])
        self._asked.clear()
        if not kept and job_id in self._hint:
            waiting = self._waiting[q]
            waiting[self._hint.pop(job_id), self._specs[job_id].gpus] -= 1
        self.reserved[q] += gpus
        self.types[job_id] = r if r != ANY_TYPE else self._node_type[slots[0][0]]

    # -- the rules ---------------------------------------------------------------------------
    def refusal(self, q: str, r: str, g: int) -> Status | None:
        """Why queue q may not take `g` more GPUs of resource r now, or None."""
        key = (q, r, g)
        if key not in self._asked:
            self._asked[key] = self._refusal(q, r, g)
        return self._asked[key]

    def _refusal(self, q: str, r: str, g: int) -> Status | None:
        book, spec = self._book, self._book.spec(q)
        n, u = spec.nominal_of(r), self.used[q, r]
        what = "" if r == ANY_TYPE else f" of {r}"
        need = book.pool_part(q, r, u + g) - book.pool_part(q, r, u)
        room = book.pool(q, r) - self._drawn(q, r)
        if u + g <= n:
            if spec.cohort is None or need <= room:
                return None
            return self._status(StatusCode.WAITING_FOR_RECLAIM, (
                f"queue {q!r} holds {u} of its {n} GPUs{what} (nominal); the rest is lent in "
                f"cohort {spec.cohort!r}, and comes back as borrowers' jobs are reclaimed or "
                "end") + self._until())
        if spec.cohort is None:
            return self._status(StatusCode.WAITING_FOR_QUEUE_QUOTA, (
                f"queue {q!r} holds {u} of its {n} GPUs{what} (nominal) and is in no cohort "
                f"to borrow from; the job needs {g} more"))
        limit = spec.borrowing_of(r)
        if limit is not None and u + g > n + limit:
            return self._status(StatusCode.BORROWING_LIMIT, (
                f"queue {q!r} would hold {u + g} GPUs{what}, over its nominal {n} + borrowing "
                f"limit {limit}"))
        # On an idle cluster the claims and the ranking hold nothing back (only the limits
        # do): a policy that never tries the claimant's job would otherwise stall the cluster.
        claims = {} if self._idle() else self._claims(q, r)
        if need > room - sum(claims.values()):
            if need <= room:
                return self._status(StatusCode.WAITING_FOR_QUOTA_IN_COHORT, (
                    f"queue {q!r} would borrow; the idle quota of cohort {spec.cohort!r} is "
                    f"kept for jobs of {_names(claims)} waiting within their nominal quota"))
            idle = sum(book.spec(p).nominal_of(r) - self.used[p, r] for p in book.peers(q))
            if g <= idle - sum(claims.values()):
                return self._status(StatusCode.LENDING_LIMIT, (
                    f"queue {q!r} would borrow {g} GPUs{what}; cohort {spec.cohort!r} has "
                    f"{idle} idle GPUs of quota but its lending limits let {max(0, room)} of "
                    "them be borrowed"))
            return self._status(StatusCode.WAITING_FOR_QUOTA_IN_COHORT, (
                f"queue {q!r} would borrow {g} GPUs{what}; cohort {spec.cohort!r} has "
                f"{max(0, room - sum(claims.values()))} idle GPUs of quota to lend"))
        ahead = None if self._idle() else self._ranked_before(q, r, room - sum(claims.values()),
                                                              need)
        if ahead is not None:
            return self._status(StatusCode.WAITING_FOR_FAIR_SHARE, (
                f"queue {q!r} ranks after {ahead!r} for borrowed GPUs in cohort "
                f"{spec.cohort!r} (priority, then decayed usage per weight: "
                f"{self._per_weight(q):.4g} vs {self._per_weight(ahead):.4g}), and {ahead!r} "
                "has a job waiting for them"))
        return None

    def _idle(self) -> bool:
        """No job holds a GPU (nor has reserved one this cycle), in a queue or not."""
        return not any(self._inner.used.values())

    def _drawn(self, q: str, r: str) -> int:
        """What the queues of q's cohort draw from its pool now."""
        book = self._book
        return sum(book.pool_part(p, r, self.used[p, r]) for p in book.peers(q))

    def _claims(self, q: str, r: str) -> dict[str, int]:
        """Pool quota the other queues of q's cohort need for their jobs waiting within their
        nominal quota (up to their idle nominal quota), by queue."""
        out = {}
        for p in self._book.peers(q):
            if p != q:
                need = self._claim(p, r)
                if need > 0:
                    out[p] = need
        return out

    def _claim(self, p: str, r: str, used: Mapping[Key, int] | None = None,
               waiting: Mapping[str, Counter[tuple[str, int]]] | None = None) -> int:
        """Pool quota queue p needs for its jobs waiting within its nominal quota of r, when
        it holds `used` and `waiting` wait (default: what it may hold now, `self.used`, and
        the jobs not started, `self._waiting`)."""
        book = self._book
        u = (self.used if used is None else used)[p, r]
        room = book.spec(p).nominal_of(r) - u
        if room <= 0:
            return 0
        sizes = (self._waiting if waiting is None else waiting).get(p, Counter())
        demand = sum(size * n for (res, size), n in sizes.items()
                     if res == r and n > 0 and size <= room)
        if used is None:
            # Its running jobs not walked yet, beyond what it may hold: its own waiting jobs
            # the policy ranked first took their room (within its nominal quota, so without
            # drawing on the pool), and they will want the pool's when walked. Without
            # counting them, a queue that reclaimed quota for such a job left it idle for the
            # borrower's next job, which took it back (and the reclaim was for nothing).
            demand += max(0, self._holds[p, r] + self._unwalked[p, r] - u)
        return book.pool_part(p, r, u + min(room, demand)) - book.pool_part(p, r, u)

    def _ranked_before(self, q: str, r: str, free: int, need: int) -> str | None:
        """The first queue ranked before q whose waiting jobs want to borrow more than the
        pool can spare once q has borrowed `need`: they get contended GPUs first."""
        book = self._book
        mine = self._rank(q)
        wanted, first = 0, None
        for b in sorted(book.peers(q), key=self._rank):
            if b == q or self._rank(b) > mine:
                continue
            wants = self._wants(b, r)
            if wants > 0:
                wanted += wants
                first = first or b
        return first if need > free - wanted else None

    def _wants(self, b: str, r: str) -> int:
        """Pool quota queue b's waiting jobs want beyond its nominal quota (and beyond its
        claim within it), up to its borrowing limit."""
        book, spec = self._book, self._book.spec(b)
        waiting = [(s, n) for (res, s), n in self._waiting.get(b, {}).items()
                   if res == r and n > 0]
        if not waiting or spec.cohort is None:
            return 0
        u, nominal = self.used[b, r], spec.nominal_of(r)
        room = max(0, nominal - u)
        within = min(room, sum(s * n for s, n in waiting if s <= room))
        beyond = sum(s * n for s, n in waiting) - within
        limit = spec.borrowing_of(r)
        if limit is not None:
            beyond = min(beyond, max(0, nominal + limit - max(u + within, nominal)))
        base = u + within
        return book.pool_part(b, r, base + beyond) - book.pool_part(b, r, base)

    def _rank(self, q: str) -> tuple[int, float, str]:
        spec = self._book.spec(q)
        return order_key(q, self._usage.of(q), spec.weight, spec.priority)

    def _per_weight(self, q: str) -> float:
        return self._usage.of(q) / self._book.spec(q).weight

    # -- reclaim -----------------------------------------------------------------------------
    def _reclaim(self, snap: Snapshot, running: list[JobView]) -> None:
        """Take lent quota back for queues whose jobs wait within their nominal quota."""
        book, now = self._book, snap.now
        for members in book.members.values():
            resources = dict.fromkeys(r for q in members for r in book.spec(q).resources())
            for r in resources:
                for lender in sorted(members, key=self._rank):
                    self._reclaim_for(lender, r, running, now)

    def _reclaim_for(self, lender: str, r: str, running: list[JobView], now: float) -> None:
        book = self._book
        claim = self._claim(lender, r)
        deficit = claim - (book.pool(lender, r) - self._drawn(lender, r))
        if claim <= 0 or deficit <= 0:
            return
        spec = book.spec(lender)
        peers = set(book.peers(lender)) - {lender}
        candidates = []
        for view in running:
            q = book.queue_of[view.spec.tenant]
            if (q in peers and view.job_id not in self.reclaimed
                    and self._kept[view.job_id][0] == r
                    and self.used[q, r] > book.spec(q).nominal_of(r)
                    and may_reclaim(spec, book.spec(q))):
                since = view.run_since if view.run_since is not None else now
                candidates.append(Candidate(view.job_id, q, view.allocated, since,
                                            since + book.spec(q).min_runtime_s))
        queues = {c.queue for c in candidates}
        got = choose(deficit, candidates, now, {q: self.used[q, r] for q in queues},
                     {q: book.spec(q).nominal_of(r) for q in queues},
                     lambda q, u: book.pool_part(q, r, u))
        if got.blocked_until is not None:
            self._reclaim_at = min(self._reclaim_at or got.blocked_until, got.blocked_until)
        for c in got.victims:
            self.used[c.queue, r] -= c.gpus
            self._unwalked[c.queue, r] -= c.gpus
            self.reclaimed[c.job_id] = lender
            self.held[c.job_id] = Status(
                code=StatusCode.RECLAIMED_BY_QUEUE, decided_by=DECIDED_BY,
                reason=f"reclaimed by queue {lender!r}: its jobs wait within its nominal quota, "
                       f"which queue {c.queue!r} had borrowed")

    def _until(self) -> str:
        if self._reclaim_at is None:
            return ""
        return f" (its borrowers' jobs reach their minimum runtime at {self._reclaim_at:g})"

    @property
    def wakeup_at(self) -> float | None:
        """When the scheduler should re-plan even if nothing happens, asked once the walk is
        over: at once (once per instant) if a refusal counted GPUs of a running job the walk
        then dropped, since the job it refused may fit now that they are free (a policy that
        re-plans from scratch, as Muri's, would otherwise leave them idle until the next
        event), or if a claim is left unmet (`_claim_unmet`); else when a job reclaim had to
        spare comes of age."""
        if not self._may_replan:
            return self._reclaim_at
        stale = any(j not in self.reclaimed for j in self._kept) and any(
            j not in self.reclaimed for j in self.held)
        if stale or self._claim_unmet():
            return self.now
        return self._reclaim_at

    def _claim_unmet(self) -> bool:
        """Whether, as the walk left it, a queue's jobs wait within its nominal quota that the
        pool cannot hold while a peer it may reclaim from borrows. Reclaim sizes a claim
        against the pool as the cycle begins, but the walk may then let another queue grow
        within its own nominal quota into the idle pool the claim counted on (srtf or
        tiresias starting a queue's wide job in place of its narrower running ones, or a
        queue's new job ranked before its running ones, which re-reserve after it). Both
        are owed that quota; the borrower is to give it back, which the next cycle's reclaim
        does. Without this the claimant waited for the next event (over an hour on trace3).
        The walk re-reserves every running job it keeps (no cycle is in place under a
        tenants file), so what it reserved is what each queue holds after it, and a running
        job it dropped (not reclaimed: the policy's own preemption, as when another queue's
        job took its GPUs) waits again, within its queue's nominal quota or not."""
        book, holds = self._book, self._holds
        waiting = {q: Counter(w) for q, w in self._waiting.items()}
        for jid, (r, gpus) in self._kept.items():
            if jid not in self.reclaimed:
                q = book.queue_of[self._specs[jid].tenant]
                waiting.setdefault(q, Counter())[r, gpus] += 1
        for q in waiting:
            spec = book.spec(q)
            if spec.cohort is None:
                continue
            for r in spec.resources():
                claim = self._claim(q, r, holds, waiting)
                if claim <= 0:
                    continue
                drawn = sum(book.pool_part(p, r, holds[p, r]) for p in book.peers(q))
                if claim <= book.pool(q, r) - drawn:
                    continue  # the pool has room: the policy left the job for its own reasons
                if any(holds[p, r] > book.spec(p).nominal_of(r) and may_reclaim(spec, book.spec(p))
                       and self._of_age(p, r) for p in book.peers(q) if p != q):
                    return True
        return False

    def _of_age(self, p: str, r: str) -> bool:
        """Whether a job of queue p this walk reserved on resource r has run p's minimum
        runtime by now (a job it starts now has run nothing): one reclaim could take."""
        book, now = self._book, self.now
        least = book.spec(p).min_runtime_s
        return any(book.queue_of.get(self._specs[j].tenant) == p
                   and (r == ANY_TYPE or t == r) and self._since.get(j, now) + least <= now
                   for j, t in self.types.items())

    # -- reports -----------------------------------------------------------------------------
    def status_for(self, job_id: str, spec: JobSpec) -> Status | None:
        """Why the queues (or, inside them, the tenants) hold a waiting job after this cycle."""
        if job_id in self.held:
            return self.held[job_id]
        q = self._book.queue_of.get(spec.tenant)
        if q is not None:
            refusals = [self.refusal(q, r, extra) for r in self._book.allowed(q, spec)
                        if (extra := self._holds[q, r] + spec.gpus - self.used[q, r]) > 0]
            if refusals and len(refusals) == len(self._book.allowed(q, spec)) and all(refusals):
                return refusals[0]
        return self._inner.status_for(job_id, spec)

    @staticmethod
    def _status(code: StatusCode, reason: str) -> Status:
        return Status(code=code, reason=reason, decided_by=DECIDED_BY)

    # -- where jobs count --------------------------------------------------------------------
    def _running_resource(self, q: str, spec: JobSpec, seen: str | None) -> str:
        resources = self._book.spec(q).resources()
        if resources == (ANY_TYPE,):
            return ANY_TYPE
        if seen in resources:
            return seen
        # Only after a scheduler restart (the layer saw no reservation): its own type, or the
        # first its queue has quota for.
        allowed = self._book.allowed(q, spec)
        return allowed[0] if allowed else resources[0]

    def _waiting_resource(self, q: str, spec: JobSpec) -> str:
        """Where a waiting job's claim counts: the first resource it may use with nominal room
        (Kueue's flavor order), else the first it may use at all."""
        allowed = self._book.allowed(q, spec) or self._book.spec(q).resources()
        for r in allowed:
            if self.used[q, r] + spec.gpus <= self._book.spec(q).nominal_of(r):
                return r
        return allowed[0]


def _names(claims: Mapping[str, int]) -> str:
    return ", ".join(f"queue {q!r}" for q in claims)
