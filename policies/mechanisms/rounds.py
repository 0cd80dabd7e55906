"""Gavel's round-based mechanism: turn time-share allocations into one round's assignment.

A heterogeneity-aware policy answers one question, "what fraction of wall time should job m
spend on GPU type j" (X[m, j], see `policies.mechanisms.allocation`); this mechanism realises
X round by round, as Gavel's `scheduler.py` does (algorithms.md §3a):

* X is recomputed when jobs arrived or left, but at most once per `reset_interval_s` (1920 s)
  once the first allocation exists; at each recomputation the per-type time every job received
  is reset (to half a round, so a new job is not infinitely behind) and what it lacked against
  its allocation is kept as a deficit;
* each round, priority[m, j] = X[m, j] / (time m got on j / time all jobs got on j), or
  X × 1e9 for a job that has not run on j since the reset, 0 where X or the throughput is 0;
* (job, type) entries are taken greedily, per type in the order v100, p100, k80 (shuffled each
  round, seeded, for heterogeneity-agnostic policies), sorted by (priority, deficit, X)
  descending, while GPUs of the type remain and the job is not already placed;
* placement by decreasing GPU count; a job keeps its GPUs when they are still free, so its
  lease is extended without a restart.

Time credit: every job that ran in the previous round is credited the time since that round
began on the type it ran on (Gavel credits the round's length; a job that finished early has
left anyway).

Space sharing (`packing` policies): allocations, priorities and received time are kept per
combination, a job alone or a pair of jobs with the same GPU count sharing GPUs. Pairs are
formed at each allocation from the active jobs whose co-located throughputs the profile knows;
a new pair starts with no time received (Gavel's bookkeeping). Both jobs of a scheduled pair
get the same GPUs and run at their profiled co-located rates.
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from policies.base import Fitter, JobView, Plan, Policy, Snapshot
from policies.mechanisms.allocation import (
    AllocationInput,
    PairTable,
    gpu_type_order,
    job_rate,
    pair_rates,
)
from policies.mechanisms.lp import FloatArray
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable

NEVER_RAN = 1e9  # Gavel's priority multiplier for a job that has not run since the reset
RESET_INTERVAL_S = 1920.0  # Gavel's minimum_time_between_allocation_resets

Combo = tuple[str, ...]  # one job, or two jobs sharing GPUs (in admission order)


@dataclass(slots=True)
class _Ledger:
    """Per job: seconds received on each GPU type since the last reset, and deficits."""

    received: dict[str, float]
    deficit: dict[str, float]


@dataclass(slots=True)
class RoundState:
    allocation: dict[Combo, dict[str, float]] = field(default_factory=dict)
    ledgers: dict[Combo, _Ledger] = field(default_factory=dict)
    type_time: dict[str, float] = field(default_factory=dict)  # Σ received, per type
    last_reset: float = 0.0
    stale: bool = False  # jobs arrived or left since the allocation was computed
    ran_on: dict[Combo, str] = field(default_factory=dict)  # last round: combination → type
    started: dict[Combo, float] = field(default_factory=dict)  # when it began this round
    last_round: float | None = None
    recomputed: int = 0


class RoundPolicy(Policy):
    """A Gavel policy: `allocate` gives X; this class runs Gavel's rounds on it."""

    placement = "count"
    replan = "round"
    aware: bool = True  # False: GPU types are visited in a seeded random order each round
    skip_unallocated: bool = False  # FIFO: a job with priority 0 does not run at all
    packing: bool = False  # allocate to pairs of jobs sharing GPUs too (needs a profile)

    def __init__(self, *, seed: int = 0, round_s: float = 360.0,
                 reset_interval_s: float = RESET_INTERVAL_S) -> None:
        self.round_s = round_s
        self.reset_interval_s = reset_interval_s
        self.state = RoundState()
        self._shuffle = random.Random(seed + 5)  # Gavel's worker-type shuffler seed
        self._position: dict[str, int] = {}
        self._order: list[str] = []  # GPU types in this round's visiting order
        self._can_run: dict[tuple[Combo, str], bool] = {}
        self._types: tuple[str, ...] = ()
        self.profile: ThroughputTable | None = None

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        self.round_s = round_s
        self._shuffle = random.Random(seed + 5)
        self.profile = profile

    @abc.abstractmethod
    def allocate(self, inp: AllocationInput) -> FloatArray:
        """X: rows are `inp.job_ids`, columns `inp.types`; rows sum to ≤ 1."""

    def allocate_packed(self, inp: AllocationInput, pairs: PairTable) -> FloatArray:
        """X for packing policies: rows are `inp.job_ids`, then `pairs.combos`."""
        raise NotImplementedError(f"{self.name} does not pack jobs")

    # -- hooks -------------------------------------------------------------------------------
    def job_added(self, job: JobView) -> None:
        st = self.state
        st.ledgers[(job.job_id,)] = _Ledger({}, {})
        st.stale = True

    def job_removed(self, job_id: str) -> None:
        st = self.state
        for combo in [c for c in st.ledgers if job_id in c]:
            del st.ledgers[combo]
            st.allocation.pop(combo, None)
            st.ran_on.pop(combo, None)
            for t in self._types:
                self._can_run.pop((combo, t), None)
        self._position.pop(job_id, None)
        st.stale = True

    def waiting_status(self, job_id: str) -> Status:
        alloc = self.state.allocation.get((job_id,))
        if alloc is not None and not any(alloc.values()) and self.skip_unallocated:
            reason = "not yet allocated GPUs (queued behind earlier jobs)"
        else:
            reason = "other jobs are further below their time share this round"
        return Status(code=StatusCode.WAITING_FOR_PRIORITY, reason=reason,
                      decided_by=self.name, queue_position=self._position.get(job_id))

    # -- the round ---------------------------------------------------------------------------
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        st = self.state
        types = self._types = gpu_type_order(snap.cluster)
        for jid in snap.jobs:  # adopt jobs not announced through job_added
            if (jid,) not in st.ledgers:
                self.job_added(snap.jobs[jid])
        half = self.round_s / 2.0
        for ledger in st.ledgers.values():
            for t in types:
                ledger.received.setdefault(t, half)
                ledger.deficit.setdefault(t, 0.0)
        left = dict(snap.cluster.gpus_by_type)
        kept: dict[Combo, str] = {}
        if st.last_round is not None and snap.now < st.last_round + self.round_s - 1e-6:
            # A cycle inside a round (GPUs freed at once): everyone keeps running and the
            # freed GPUs go to the next entries in this round's priority order.
            kept = {c: t for c, t in st.ran_on.items() if all(j in snap.jobs for j in c)}
            for c, t in kept.items():
                left[t] -= snap.jobs[c[0]].gpus
            order = self._order
        else:
            self._credit(snap.now)
            if st.stale and (snap.now - st.last_reset >= self.reset_interval_s
                             or st.last_reset == 0.0):
                self._reset(snap, types)
            order = list(types)
            if not self.aware:
                self._shuffle.shuffle(order)
            self._order = order
            st.started = {}
            st.last_round = snap.now
        chosen = self._select(snap, order, left, {j for c in kept for j in c})
        for combo in chosen:
            st.started[combo] = snap.now
        chosen = {**kept, **chosen}
        plan = Plan()
        for combo, t in sorted(chosen.items(), key=lambda kv: -snap.jobs[kv[0][0]].gpus):
            slots = fit.try_place(combo[0], snap.jobs[combo[0]].gpus, t)
            if slots is None:
                # The selection counted GPUs per type, so only an admission step in front of
                # the policy (tenant quotas, policies.mechanisms.admission) refuses: the combo
                # sits out this round, uncharged.
                del chosen[combo]
                st.started.pop(combo, None)
                reason = fit.explain(snap.jobs[combo[0]].gpus)
                for jid in combo:
                    plan.blocked[jid] = Status(code=StatusCode.WAITING_BY_POLICY, reason=reason,
                                               decided_by=self.name)
                continue
            for jid in combo:
                plan.run[jid] = slots
                if len(combo) > 1:
                    plan.groups[jid] = tuple(sorted(combo))
        st.ran_on = dict(chosen)
        waiting = [jid for jid in snap.jobs if jid not in plan.run]
        self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        plan.free_gpus = fit.free_gpus
        return plan

    def _credit(self, now: float) -> None:
        st = self.state
        if st.last_round is None:
            return
        for combo, t in st.ran_on.items():
            elapsed = now - st.started.get(combo, st.last_round)
            ledger = st.ledgers.get(combo)
            if ledger is not None:
                ledger.received[t] = ledger.received.get(t, 0.0) + elapsed
                st.type_time[t] = st.type_time.get(t, 0.0) + elapsed

    def _reset(self, snap: Snapshot, types: tuple[str, ...]) -> None:
        st = self.state
        half = self.round_s / 2.0
        since = snap.now - st.last_reset
        for combo, ledger in st.ledgers.items():
            alloc = st.allocation.get(combo)
            for t in types:
                should = alloc[t] * since if alloc is not None else 0.0
                ledger.deficit[t] += should - (ledger.received[t] - half)
                ledger.received[t] = half
        st.type_time = {t: half * len(st.ledgers) for t in types}
        st.last_reset = snap.now
        inp = AllocationInput.from_snapshot(snap, tuple(sorted(types)))
        combos: list[Combo] = [(jid,) for jid in inp.job_ids]
        if not inp.job_ids:
            x = np.zeros((0, len(inp.types)))
        elif self.packing:
            pairs = PairTable.build(snap, inp, self.profile)
            for combo in pairs.combos:  # new pairs start with nothing received
                st.ledgers.setdefault(combo, _Ledger(dict.fromkeys(types, 0.0),
                                                     dict.fromkeys(types, 0.0)))
            combos += pairs.combos
            x = self.allocate_packed(inp, pairs)
        else:
            x = self.allocate(inp)
        x = np.clip(x, 0.0, 1.0)
        st.allocation = {c: {t: float(x[i, j]) for j, t in enumerate(inp.types)}
                         for i, c in enumerate(combos)}
        st.stale = False
        st.recomputed += 1

    def _select(self, snap: Snapshot, order: list[str], left: dict[str, int],
                busy: set[str]) -> dict[Combo, str]:
        """Gavel's greedy pass over (combination, type) entries in priority order.

        Per type, entries are sorted by (priority, deficit, allocation) descending, ties in
        insertion order (Gavel's stable sort), computed with numpy; the walk over a type stops
        as soon as its GPUs are all taken.
        """
        st = self.state
        combos = [c for c in st.ledgers if all(j in snap.jobs for j in c)]
        chosen: dict[Combo, str] = {}
        if not combos:
            return chosen
        n = len(combos)
        gpus = [snap.jobs[c[0]].gpus for c in combos]
        none: dict[str, float] = {}
        # Each combination's ledger and allocation looked up once, not once per type and field.
        ledgers = [st.ledgers[c] for c in combos]
        allocs = [st.allocation.get(c, none) for c in combos]
        for t in order:
            if left.get(t, 0) <= 0:
                continue
            alloc = np.fromiter((a.get(t, 0.0) for a in allocs), np.float64, n)
            got = np.fromiter((g.received[t] for g in ledgers), np.float64, n)
            deficit = np.fromiter((g.deficit[t] for g in ledgers), np.float64, n)
            ok = np.fromiter((self._runnable(snap, c, t) for c in combos), np.bool_, n)
            total = st.type_time.get(t, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                fair = np.where((got > 0) & (total > 0), alloc / (got / total), alloc * NEVER_RAN)
            prio = np.where((alloc > 0) & ok, fair, 0.0)
            ranked = np.lexsort((np.arange(n), -alloc, -deficit, -prio))
            # Plain lists for the walk: indexing a numpy array one element at a time is slow.
            runs, share = ok.tolist(), alloc.tolist()
            for i in ranked.tolist():
                if left[t] <= 0:
                    break
                combo = combos[i]
                if not runs[i] or gpus[i] > left[t] or not busy.isdisjoint(combo):
                    continue
                if self.skip_unallocated and share[i] <= 0:
                    continue
                left[t] -= gpus[i]
                chosen[combo] = t
                busy.update(combo)
        return chosen

    def _runnable(self, snap: Snapshot, combo: Combo, t: str) -> bool:
        """Whether the combination makes progress on type t (rates never change: cached)."""
        hit = self._can_run.get((combo, t))
        if hit is None:
            if len(combo) == 1:
                hit = job_rate(snap.jobs[combo[0]], t) > 0
            else:
                rates = pair_rates(self.profile, snap.jobs[combo[0]], snap.jobs[combo[1]], t)
                hit = rates is not None and rates[0] > 0 and rates[1] > 0
            self._can_run[(combo, t)] = hit
        return hit
