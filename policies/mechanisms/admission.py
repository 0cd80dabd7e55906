"""Tenant admission: GPU quotas, queued-jobs quotas and weighted fair share, before any policy.

The step sits between the scheduler and whichever policy runs, without the policy knowing:

- At submit, `submit_refusal` rejects a job whose tenant already has `max_queued` waiting jobs,
  or that asks for more GPUs than the tenant's `max_gpus` (it could never start).
- In a cycle, the policy reserves GPUs only through its `Fitter`; `TenantGate` wraps the
  placer's fitter and refuses a reservation the tenant is not entitled to. The job is then held
  (it stays queued, with a status saying why), never rejected.

Entitlement, for a job of tenant t asking for g GPUs when t's jobs hold `used` GPUs:

1. Quota: `used + g <= max_gpus(t)`.
2. Weighted fair share: `used + g <= share(t)`, or no other tenant is owed GPUs, or no job
   holds any GPU. `share` is the weighted max-min split of the cluster over the tenants'
   demands (GPUs their active jobs ask for, capped by their quotas;
   `schemas.tenants.weighted_shares`), so an idle tenant's share goes to the busy ones.
   Tenant u is owed when it holds less than its share and has a job waiting. So a tenant
   borrows beyond its share only while every tenant with waiting jobs has its share; and GPUs
   are kept free for a tenant below its share whose next job is wider than what is free
   (a reservation: without it a wide job of a light tenant would starve). Shares are met in
   whole gangs: a tenant below its share may start a job that takes it above. On an idle
   cluster this rule holds nothing back, so the step can never leave the whole cluster idle
   while jobs wait (a policy that never tries the owed tenant's job would otherwise stall it).

Both rules only gate starts (and an elastic job's growth): a running job keeping its GPUs is
never refused, so the step preempts nothing by itself; shares are restored as jobs finish or as
the policy preempts. A running job counts for its tenant until the walk re-reserves it (a job
the policy then drops still counts for that cycle: conservative, never over the quota). Because
a refusal depends on the tenant, not only on the gang size, the gate tells the policy its
fitter is not monotone. A co-located group (Muri, Gavel's packing) is reserved under one
member's id, so its GPUs are charged to that member's tenant.

A tenants file with queues adds the queue layer around this gate (`policies.mechanisms.queues`,
docs/queues.md); the fair-share rule is then split per queue (`groups`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import TYPE_CHECKING

from domain.placement import Scheme
from policies.mechanisms.quota import Book
from policies.mechanisms.quota import submit_refusal as queue_refusal
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.status import Status, StatusCode
from schemas.tenants import TenantsConfig, weighted_shares

if TYPE_CHECKING:
    from policies.base import Fitter, Snapshot

DECIDED_BY = "tenancy"
_EPS = 1e-9


def submit_refusal(config: TenantsConfig, spec: JobSpec, waiting: int) -> str | None:
    """Why a submission is rejected by its tenant's quotas, or None: it already has
    `max_queued` waiting jobs, or the job asks for more than its `max_gpus` or than its queue
    may ever hold (holding it would keep it waiting for ever)."""
    limits = config.limits(spec.tenant)
    if config.queues:
        why = queue_refusal(Book.of(config), spec)
        if why is not None:
            return why
    if limits.max_gpus is not None and spec.gpus > limits.max_gpus:
        return (f"asks for {spec.gpus} GPUs; tenant {spec.tenant!r} may hold at most "
                f"{limits.max_gpus} (max_gpus)")
    cap = limits.max_queued
    if cap is None or waiting < cap:
        return None
    return (f"tenant {spec.tenant!r} already has {waiting} waiting jobs, its limit "
            f"(max_queued = {cap})")


class FitterGate:
    """A fitter in front of another: reservations go through to `inner` unless the gate
    refuses them, and `explain` then gives the gate's last refusal. A gate's refusals depend
    on the job, not only on the gang's size, so it is neither monotone nor fails by size."""

    def __init__(self, inner: Fitter) -> None:
        self._inner = inner
        self.monotone = False
        self.fails_by_size = False
        self._last_refusal: str | None = None

    @property
    def free_gpus(self) -> int:
        return self._inner.free_gpus

    @free_gpus.setter
    def free_gpus(self, value: int) -> None:  # the Fitter protocol declares it a variable
        self._inner.free_gpus = value

    @property
    def scheme(self) -> Scheme:
        return self._inner.scheme

    def free_of(self, gpu_type: str) -> int:
        return self._inner.free_of(gpu_type)

    @property
    def counts_decide(self) -> bool:
        return False  # a gate's refusals depend on the job, not on the GPUs free alone

    def let_go(self, staying: Mapping[str, int]) -> dict[str, GpuSlots]:
        raise AssertionError("a gate never lets counts decide")

    @property
    def idle_gpus(self) -> int:
        raise AssertionError("a gate never lets counts decide")

    def stay_but(self, running: Collection[str], given_up: AbstractSet[str]) -> bool:
        return False  # as `keep_ahead`

    def blocked_displacing(self, gpus: int, victims: Iterable[str]) -> bool:
        return False  # a gate's refusals depend on the job: no proof by GPUs alone

    def keep_ahead(self, job_ids: Collection[str]) -> dict[str, GpuSlots] | None:
        return None  # a gate counts each job it lets through: the walk goes through it

    def keep_all_but(self, running: Collection[str], walked: AbstractSet[str]
                     ) -> dict[str, GpuSlots] | None:
        return None  # as `keep_ahead`

    def stay_all_but(self, running: Collection[str], walked: AbstractSet[str]) -> bool:
        return False  # as `keep_ahead`

    def keep_in_turn(self, job_ids: Sequence[str], gpus: Sequence[int], below: int,
                     start: int = 0) -> list[GpuSlots | None]:
        return []  # as `keep_ahead`

    def explain(self, gpus: int) -> str:
        if self._last_refusal is not None:
            return self._last_refusal
        return self._inner.explain(gpus)


class TenantGate(FitterGate):
    """The policy's fitter for one cycle, refusing what a tenant is not entitled to."""

    # Set by the queue layer (policies.mechanisms.queues); tenants alone reclaim nothing.
    reclaimed: Mapping[str, str] = MappingProxyType({})  # victim job → the queue taking back
    wakeup_at: float | None = None  # re-plan then: reclaim waits for a minimum runtime

    def __init__(self, inner: Fitter, snap: Snapshot, config: TenantsConfig,
                 groups: Mapping[str, str] | None = None,
                 capacity: Mapping[str, float] | None = None) -> None:
        """`groups` (tenant → group, with queues: its queue) splits fair share: tenants
        share their group's `capacity` and are owed only against their own group."""
        super().__init__(inner)  # a tenant's quota refuses one job and takes another
        self._config = config
        self._specs = {jid: v.spec for jid, v in snap.jobs.items()}
        self.used: Counter[str] = Counter()
        self._kept: dict[str, int] = {}  # running at the cycle's start, not yet re-reserved
        self._waiting: Counter[str] = Counter()  # per tenant: its jobs not yet started
        demand: Counter[str] = Counter()
        for jid, view in snap.jobs.items():
            tenant = view.spec.tenant
            demand[tenant] += view.gpus
            if view.running:
                self.used[tenant] += view.allocated
                self._kept[jid] = view.allocated
            else:
                self._waiting[tenant] += 1
        self.quota = {t: self._config.limits(t).max_gpus for t in demand}
        capped = {t: min(d, q) if (q := self.quota[t]) is not None else d
                  for t, d in demand.items()}
        weights = {t: self._config.limits(t).weight for t in demand}
        self._group = groups or {}
        if groups is None:
            self.shares = weighted_shares(snap.cluster.total_gpus, capped, weights)
        else:
            self.shares = {}
            for g in sorted({self._group.get(t, "") for t in demand}):
                mine = {t: d for t, d in capped.items() if self._group.get(t, "") == g}
                cap = (capacity or {}).get(g, snap.cluster.total_gpus)
                self.shares |= weighted_shares(cap, mine, {t: weights[t] for t in mine})
        self.held: dict[str, Status] = {}  # refused this cycle, with why

    def try_place(self, job_id: str, gpus: int, gpu_type: str | None = None,
                  within: Collection[str] | None = None) -> GpuSlots | None:
        spec = self._specs[job_id]
        tenant = spec.tenant
        kept = self._kept.get(job_id, 0)
        refusal = None if gpus <= kept else self.refusal(tenant, gpus - kept)
        self._last_refusal = None if refusal is None else refusal.reason
        if refusal is not None:
            self.held[job_id] = refusal
            return None
        slots = self._inner.try_place(job_id, gpus, gpu_type, within)
        if slots is not None:
            self.held.pop(job_id, None)
            self.used[tenant] += gpus - self._kept.pop(job_id, 0)
            if kept == 0 and self._waiting[tenant] > 0:
                self._waiting[tenant] -= 1
        return slots

    # -- the rules ---------------------------------------------------------------------------
    def refusal(self, tenant: str, extra: int) -> Status | None:
        """Why tenant may not take `extra` more GPUs now, or None."""
        used = self.used[tenant]
        cap = self.quota.get(tenant, self._config.limits(tenant).max_gpus)
        if cap is not None and used + extra > cap:
            return Status(code=StatusCode.WAITING_FOR_TENANT_QUOTA, decided_by=DECIDED_BY,
                          reason=f"tenant {tenant!r} holds {used} of its {cap} GPUs (max_gpus); "
                                 f"the job needs {extra} more")
        share = self.shares.get(tenant, 0.0)
        if used + extra <= share + _EPS or not self._busy(tenant):
            return None
        owed = self.owed(exclude=tenant)
        if not owed:
            return None
        return Status(code=StatusCode.WAITING_FOR_FAIR_SHARE, decided_by=DECIDED_BY,
                      reason=f"tenant {tenant!r} would hold {used + extra} GPUs, above its fair "
                             f"share of {share:.1f}, while {', '.join(map(repr, owed))} "
                             f"below theirs wait")

    def owed(self, exclude: str = "") -> list[str]:
        """Tenants below their share with a job waiting, by name (with groups: those of
        `exclude`'s group)."""
        group = self._group.get(exclude, "")
        return [tenant for tenant in sorted(self._waiting)
                if tenant != exclude and self._waiting[tenant] > 0
                and self.used[tenant] < self.shares.get(tenant, 0.0) - _EPS
                and (not self._group or self._group.get(tenant, "") == group)]

    def _busy(self, tenant: str) -> bool:
        """Whether any job holds a GPU (with groups: in `tenant`'s group)."""
        if not self._group:
            return any(self.used.values())
        group = self._group.get(tenant, "")
        return any(n for t, n in self.used.items() if self._group.get(t, "") == group)

    def status_for(self, job_id: str, spec: JobSpec) -> Status | None:
        """Why the admission step holds a waiting job after this cycle, or None."""
        if job_id in self.held:
            return self.held[job_id]
        # Never reached by the policy's walk: would the step hold it as the cycle ended?
        return self.refusal(spec.tenant, spec.gpus)
