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
* placement by decreasing GPU count, and within a count the jobs that ran on the type last
  round first (Gavel's lease extension): a job keeps its GPUs when they are still free, so
  its lease is extended without a restart, rather than losing them to a new job of its size.

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
from policies.mechanisms.lp import FloatArray, IntArray
from policies.mechanisms.round_ledger import (
    NO,
    UNKNOWN,
    YES,
    BoolArray,
    Combo,
    RoundLedger,
)
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable

NEVER_RAN = 1e9  # Gavel's priority multiplier for a job that has not run since the reset
RESET_INTERVAL_S = 1920.0  # Gavel's minimum_time_between_allocation_resets


@dataclass(slots=True)
class RoundState:
    ledger: RoundLedger = field(default_factory=RoundLedger)  # per combination and type
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
        # The last plan's active jobs and those it ran: waiting jobs' positions, worked out
        # when asked (`waiting_status`).
        self._last: tuple[list[str], set[str]] = ([], set())
        self._position: dict[str, int] | None = {}
        self._order: list[str] = []  # GPU types in this round's visiting order
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
        st.ledger.add((job.job_id,), job.gpus)
        st.stale = True

    def job_removed(self, job_id: str) -> None:
        st = self.state
        for combo in [c for c in st.ran_on if job_id in c]:
            del st.ran_on[combo]
        st.ledger.remove_job(job_id)
        st.stale = True

    def waiting_status(self, job_id: str) -> Status:
        if self.skip_unallocated and self.state.ledger.unallocated((job_id,)):
            reason = "not yet allocated GPUs (queued behind earlier jobs)"
        else:
            reason = "other jobs are further below their time share this round"
        if self._position is None:
            jobs, ran = self._last
            waiting = [jid for jid in jobs if jid not in ran]
            self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        return Status(code=StatusCode.WAITING_FOR_PRIORITY, reason=reason,
                      decided_by=self.name, queue_position=self._position.get(job_id))

    # -- the round ---------------------------------------------------------------------------
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        st = self.state
        ledger = st.ledger
        types = gpu_type_order(snap.cluster)
        if not ledger.singles.issuperset(snap.jobs):
            for jid in snap.jobs:  # adopt jobs not announced through job_added
                if (jid,) not in ledger:
                    self.job_added(snap.jobs[jid])
        half = self.round_s / 2.0
        ledger.ensure_types(types, half)
        ledger.fill_unset(half)
        left = dict(snap.cluster.gpus_by_type)
        kept: dict[Combo, str] = {}
        if st.last_round is not None and snap.now < st.last_round + self.round_s - 1e-6:
            # A cycle inside a round (GPUs freed at once): everyone keeps running and the
            # freed GPUs go to the next entries in this round's priority order.
            kept = {c: t for c, t in st.ran_on.items() if all(j in snap.jobs for j in c)}
            for c, t in kept.items():
                left[t] -= ledger.size_of(c)
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
        size = ledger.size_of
        ran_on = st.ran_on
        for combo, t in sorted(chosen.items(),
                               key=lambda kv: (-size(kv[0]), ran_on.get(kv[0]) != kv[1])):
            slots = fit.try_place(combo[0], size(combo), t)
            if slots is None:
                # The selection counted GPUs per type, so only an admission step in front of
                # the policy (tenant quotas, policies.mechanisms.admission) refuses: the combo
                # sits out this round, uncharged.
                del chosen[combo]
                st.started.pop(combo, None)
                reason = fit.explain(size(combo))
                for jid in combo:
                    plan.blocked[jid] = Status(code=StatusCode.WAITING_BY_POLICY, reason=reason,
                                               decided_by=self.name)
                continue
            for jid in combo:
                plan.run[jid] = slots
                if len(combo) > 1:
                    plan.groups[jid] = tuple(sorted(combo))
        st.ran_on = dict(chosen)
        self._last, self._position = (list(snap.jobs), set(plan.run)), None
        plan.free_gpus = fit.free_gpus
        return plan

    def _credit(self, now: float) -> None:
        st = self.state
        if st.last_round is None:
            return
        ledger = st.ledger
        for combo, t in st.ran_on.items():
            elapsed = now - st.started.get(combo, st.last_round)
            row = ledger.row.get(combo)
            if row is not None:
                ledger.received[row, ledger.col[t]] += elapsed
                st.type_time[t] = st.type_time.get(t, 0.0) + elapsed

    def _reset(self, snap: Snapshot, types: tuple[str, ...]) -> None:
        st = self.state
        ledger = st.ledger
        half = self.round_s / 2.0
        since = snap.now - st.last_reset
        rows, cols = ledger.live_rows(), ledger.cols(types)
        at = np.ix_(rows, cols)
        # What each combination should have had (none without an allocation) less what it got.
        ledger.deficit[at] += ledger.alloc[at] * since - (ledger.received[at] - half)
        ledger.received[at] = half
        st.type_time = {t: half * len(ledger) for t in types}
        st.last_reset = snap.now
        inp = AllocationInput.from_snapshot(snap, tuple(sorted(types)))
        combos: list[Combo] = [(jid,) for jid in inp.job_ids]
        if not inp.job_ids:
            x = np.zeros((0, len(inp.types)))
        elif self.packing:
            pairs = PairTable.build(snap, inp, self.profile)
            for combo in pairs.combos:  # new pairs start with nothing received
                if combo not in ledger:
                    ledger.add(combo, snap.jobs[combo[0]].gpus, received=0.0)
            combos += pairs.combos
            x = self.allocate_packed(inp, pairs)
        else:
            x = self.allocate(inp)
        ledger.set_allocation(combos, inp.types, np.clip(x, 0.0, 1.0))
        st.stale = False
        st.recomputed += 1

    def _select(self, snap: Snapshot, order: list[str], left: dict[str, int],
                busy: set[str]) -> dict[Combo, str]:
        """Gavel's greedy pass over (combination, type) entries in priority order.

        Per type, entries are sorted by (priority, deficit, allocation) descending, ties in
        the order the combinations were added (Gavel's stable sort), from the ledger's
        columns; the walk over a type stops as soon as its GPUs are all taken.
        """
        st = self.state
        ledger = st.ledger
        rows = ledger.live_rows()
        if len(ledger.singles) != len(snap.jobs):  # some are out of the policy's sight
            rows = rows[[ledger.seen_in(r, snap.jobs) for r in rows.tolist()]]
        chosen: dict[Combo, str] = {}
        if not len(rows):
            return chosen
        gpus = ledger.gpus[rows]
        sizes = gpus.tolist()
        for t in order:
            if left.get(t, 0) <= 0:
                continue
            col = ledger.col[t]
            alloc = ledger.alloc[rows, col]
            # Only entries that could be taken are ranked and walked: the rest are passed over
            # wherever they stand.
            can = self._runnable(snap, rows, t) & (gpus <= left[t])
            if self.skip_unallocated:
                can &= alloc > 0
            at = np.flatnonzero(can)
            if not len(at):
                continue
            share, ids = alloc[at], rows[at]
            got, deficit = ledger.received[ids, col], ledger.deficit[ids, col]
            total = st.type_time.get(t, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                fair = np.where((got > 0) & (total > 0), share / (got / total), share * NEVER_RAN)
            prio = np.where(share > 0, fair, 0.0)
            for i in at[np.lexsort((ids, -share, -deficit, -prio))].tolist():
                if left[t] <= 0:
                    break
                combo = ledger.combo_at(int(rows[i]))
                if sizes[i] > left[t] or not busy.isdisjoint(combo):
                    continue
                left[t] -= sizes[i]
                chosen[combo] = t
                busy.update(combo)
        return chosen

    def _runnable(self, snap: Snapshot, rows: IntArray, t: str) -> BoolArray:
        """Whether each of `rows` makes progress on type t (rates never change: worked out
        once per combination and type)."""
        ledger = self.state.ledger
        col = ledger.col[t]
        runs = ledger.runs[rows, col]
        for i in np.flatnonzero(runs == UNKNOWN).tolist():
            combo = ledger.combo_at(int(rows[i]))
            if len(combo) == 1:
                hit = job_rate(snap.jobs[combo[0]], t) > 0
            else:
                rates = pair_rates(self.profile, snap.jobs[combo[0]], snap.jobs[combo[1]], t)
                hit = rates is not None and rates[0] > 0 and rates[1] > 0
            runs[i] = YES if hit else NO
            ledger.runs[rows[i], col] = runs[i]
        out: BoolArray = runs == YES
        return out
