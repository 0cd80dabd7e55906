"""Pollux (Qiao et al., OSDI'21): co-adaptive GPU allocation and batch sizes for goodput.

Every 60 s (a slot: `--round-s` changes it) the cluster's GPUs are re-allocated among the
active jobs to maximise a fairness-weighted sum of their goodput, Pollux's objective
(petuum/adaptdl osdi21-artifact, `simulator/pollux.py`):

* a job's speedup on an allocation is its goodput there, with the batch size that maximises it
  (`domain.goodput`), over its goodput at a fair share (ceil(GPUs / jobs) GPUs on one node);
  scaled by dominant share x nodes (= nodes / GPUs) as Pollux does;
* a job whose allocation changes pays a restart penalty: its speedup is multiplied by
  max(age - restarts * 30 s, 0) / (age + 30 s);
* the allocation maximises the power mean with p = -1 of the penalised speedups,
  (sum((s_j + 1e-3)^-1) / J)^-1;
* a job may use at most twice the GPUs it has ever run with (Pollux explores its scalability
  gradually), at most max_batch / min_local_batch GPUs, at most 16 nodes; at most one
  distributed job (spanning nodes) per node, to avoid network interference; any job may be
  preempted (no minimum).

The best GPU counts are found exactly (`policies.pollux.optimiser`, where Pollux runs a
genetic search), then packed onto nodes (`policies.pollux.packing`).

Jobs without a goodput profile are scheduled too: an elastic job (ElasticFlow's scaling
tables) by its throughput at each GPU count it may use (fixed batch size, efficiency 1), a
rigid job at its requested GPU count (speedup proportional to GPUs, Pollux's default before a
job is profiled).

Differences from the artifact, all deliberate: the throughput model is fitted once to the
whole profile (Pollux learns it online from the placements a job has run on and is optimistic
until then); a job values candidate batch sizes with the gradient statistics at each
candidate (see `domain.goodput`); the search is exact on GPU counts instead of genetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike

from domain.goodput import GoodputModel, job_batch, model_for
from domain.overhead import OverheadModel
from policies.base import Fitter, JobView, Plan, Policy, Replan, Snapshot
from policies.pollux.optimiser import (
    MAX_NODES,
    JobTerms,
    SpeedupFn,
    best_counts,
    job_value,
    penalty,
    power_mean,
)
from policies.pollux.packing import Nodes, kept, settle
from schemas.events import GpuSlots
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable


class Pollux(Policy):
    name = "pollux"
    description = "Pollux: GPUs and batch sizes for the p=-1 power mean of goodput speedups"
    placement = "consolidated"
    chooses_nodes = True  # the optimiser's allocation matrix names each job's nodes
    # Periodic: a slotted policy that always asks to be woken a slot later re-plans every
    # slot (60 s by default, `--round-s` sets it), and jobs that arrive wait for the next one.
    replan: ClassVar[Replan] = "slot"
    adapts_batch_size: ClassVar[bool] = True  # the scheduler lets jobs choose batch sizes

    def __init__(self) -> None:
        self.round_s = 60.0
        self.seed = 0
        self._profiled: dict[str, int] = {}  # most GPUs a job has run with
        self._starts: dict[str, int] = {}  # times a job was (re)started
        self._service: dict[str, float] = {}  # attained GPU-seconds
        self._slots: dict[str, GpuSlots] = {}  # placements this policy handed out last
        self._models: dict[str, GoodputModel] = {}
        self._last_at: float | None = None
        self._position: dict[str, int] = {}
        self.last_objective = 0.0
        self.repairs = 0  # jobs the packing moved to a smaller count than the optimum

    def configure(self, *, seed: int, round_s: float,
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        self.round_s = round_s
        self.seed = seed  # the optimiser is deterministic; kept for reproducible variants

    def job_removed(self, job_id: str) -> None:
        for table in (self._profiled, self._starts, self._service, self._slots, self._models,
                      self._position):
            table.pop(job_id, None)

    def waiting_status(self, job_id: str) -> Status:
        return Status(code=StatusCode.WAITING_BY_POLICY,
                      reason="no GPUs at this round: the others' speedups weigh more",
                      decided_by=self.name, queue_position=self._position.get(job_id))

    # -- the job terms ------------------------------------------------------------------------
    def _model(self, job: JobView) -> GoodputModel:
        model = self._models.get(job.job_id)
        if model is None:
            assert job.spec.goodput is not None
            model = self._models[job.job_id] = model_for(job.spec.goodput)
        return model

    def terms(self, job: JobView, now: float, total_gpus: int, fair: int, node_gpus: int
              ) -> JobTerms:
        """The job's allowed counts, speedup function and restart penalty this round."""
        spec = job.spec
        explore = max(2 * self._profiled.get(job.job_id, 0), 1)
        restarts = max(self._starts.get(job.job_id, 0) - 1, 0)  # (re)starts after the first
        factor = penalty(max(now - spec.submit_time_s, 0.0), restarts)
        top = min(total_gpus, MAX_NODES * node_gpus, spec.max_gpus or total_gpus)
        speedup: SpeedupFn
        if spec.goodput is not None:
            model = self._model(job)
            batch = job_batch(spec.goodput, spec.batch_size, adaptive=True)
            if batch is None:
                top = min(top, model.max_batch // model.min_local)
            epoch = model.epoch_at(job.iterations_done)
            base = float(model.rates(1, fair, batch)[epoch])

            def goodput_speedup(nodes: int, gpus: int) -> float:
                return float(model.rates(nodes, gpus, batch)[epoch]) / base

            counts = tuple(range(1, min(top, explore) + 1))
            speedup = goodput_speedup
        elif spec.scaling is not None:
            levels = [g for g in spec.gpu_levels if g <= top]
            curve = spec.scaling
            base = float(np.interp(fair, levels, [curve[g] for g in levels])) if levels else 1.0
            allowed = [g for g in levels if g <= explore] or levels[:1]

            def scaling_speedup(nodes: int, gpus: int) -> float:
                return curve.get(gpus, 0.0) / base

            counts = tuple(allowed)
            speedup = scaling_speedup
        else:
            g0 = spec.gpus

            def rigid_speedup(nodes: int, gpus: int) -> float:
                return gpus / fair

            counts = (g0,) if g0 <= total_gpus else ()
            speedup = rigid_speedup
        return JobTerms(job.job_id, counts, speedup, job.allocated if job.running else 0,
                        factor)

    # -- one round ----------------------------------------------------------------------------
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan:
        now = snap.now
        elapsed = 0.0 if self._last_at is None else now - self._last_at
        self._last_at = now
        for job in snap.running:
            self._service[job.job_id] = self._service.get(job.job_id, 0.0) + \
                job.allocated * elapsed
        jobs = sorted(snap.jobs.values(), key=lambda j: (
            self._service.get(j.job_id, 0.0), j.spec.submit_time_s, j.job_id))
        plan = Plan()
        if not jobs:
            self._position = {}
            return plan
        cluster = snap.cluster
        total = cluster.total_gpus
        node_gpus = max(n.gpus for n in cluster.nodes)
        scale = len(cluster.nodes) / total  # Pollux: dominant share (1/GPUs) x nodes
        fair = max(1, math.ceil(total / len(jobs)))
        terms = [self.terms(j, now, total, fair, node_gpus) for j in jobs]
        index = {n.node_id: i for i, n in enumerate(cluster.nodes)}
        current = {j.job_id: self._slots[j.job_id] for j in snap.running
                   if j.job_id in self._slots}
        base = Nodes.of(cluster)
        placed, repaired = settle(terms, best_counts(terms, total, node_gpus, scale),
                                  base, current, index, scale)
        self.repairs += repaired
        order = [t.job_id for t in terms]
        self._realise(order, placed, current, {t.job_id: t for t in terms}, fit, plan, index,
                      base)
        values = []
        for t in terms:
            slots = plan.run.get(t.job_id, ())
            g = sum(len(x) for _, x in slots)
            values.append(job_value(t, g, len(slots), scale, g != t.current or (
                g > 0 and slots != self._slots.get(t.job_id))))
        self.last_objective = power_mean(values)
        self._record(snap, plan)
        waiting = [j for j in order if j not in plan.run]
        self._position = {jid: i for i, jid in enumerate(waiting, start=1)}
        for jid in waiting:
            plan.blocked[jid] = self.waiting_status(jid)
        plan.free_gpus = fit.free_gpus
        plan.wakeup_at = now + self.round_s
        return plan

    def _realise(self, order: Sequence[str], placed: Mapping[str, list[tuple[int, int]]],
                 current: Mapping[str, GpuSlots], terms: Mapping[str, JobTerms], fit: Fitter,
                 plan: Plan, index: Mapping[str, int], nodes: Nodes) -> None:
        """Reserve the packed placements through the placer: kept jobs first (their own
        GPUs), then the others on the nodes the packing chose."""
        want = {jid: sum(k for _, k in parts) for jid, parts in placed.items()}
        keep = kept(current, want)
        live = nodes.copy()
        for jid in order:
            if jid in keep:
                slots = fit.try_place(jid, want[jid])
                if slots is not None:
                    plan.run[jid] = slots
                    live.take(slots, index)
        largest = max(nodes.size)
        rest = [j for j in order if j not in plan.run and want.get(j, 0) > 0]
        rest.sort(key=lambda j: (want[j] <= largest, -want[j]))
        for jid in rest:
            slots = fit.try_place(jid, want[jid], within=[nodes.ids[i] for i, _ in placed[jid]])
            # A safety net should the placer pick other GPUs than the packing assumed: the
            # same rule on the live state, then the next smaller counts.
            smaller = [c for c in terms[jid].counts if c <= want[jid]][::-1][:3]
            for g in smaller if slots is None else ():
                parts = live.choose(g)
                if parts is not None:
                    slots = fit.try_place(jid, g, within=[live.ids[i] for i, _ in parts])
                    if slots is not None:
                        break
            if slots is not None:
                plan.run[jid] = slots
                live.take(slots, index)

    def _record(self, snap: Snapshot, plan: Plan) -> None:
        for jid, slots in plan.run.items():
            g = sum(len(x) for _, x in slots)
            self._profiled[jid] = max(self._profiled.get(jid, 0), g)
            if self._slots.get(jid) != slots or not snap.jobs[jid].running:
                self._starts[jid] = self._starts.get(jid, 0) + 1
            self._slots[jid] = slots
        for jid in list(self._slots):
            if jid not in plan.run:
                del self._slots[jid]
