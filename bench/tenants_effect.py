"""Tenants: what the admission step costs and what it does, on a bundled trace.

The trace's jobs are dealt round-robin to tenants t0, t1, t2 (the bundled traces have no user
column), which get weights 1, 2, 3. Each policy runs twice, without and with the tenants file;
prints wall time and, per tenant, its part of the GPU-seconds held while every tenant has a
job waiting (contention), and its average JCT. With weights, that part should go 1:2:3.

    .venv/bin/python bench/tenants_effect.py                    # muri/trace3 on n8g8, srtf
    .venv/bin/python bench/tenants_effect.py --trace muri/trace1 --policies srtf,tiresias,fifo
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from typing import Any
from unittest import mock

from loom.simulate import SimConfig, run_simulation
from schemas.events import JobTransitionV1
from schemas.job import JobState
from schemas.tenants import TenantLimits, TenantsConfig
from services.metrics.core import MetricsCore
from traces import load_cluster, load_trace

WEIGHTS = {"t0": 1.0, "t1": 2.0, "t2": 3.0}


class Occupancy:
    """Per tenant, GPUs held integrated over the time every tenant has a job waiting."""

    def __init__(self, tenant_of: dict[str, str]) -> None:
        self.tenant_of = tenant_of
        self.held: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.gpu_s: dict[str, float] = dict.fromkeys(WEIGHTS, 0.0)
        self.contended_s = 0.0
        self.since = 0.0
        self.last_gpus: dict[str, int] = {}

    def record(self, t: JobTransitionV1, at: float) -> None:
        if all(self.waiting[x] > 0 for x in WEIGHTS):
            self.contended_s += at - self.since
            for tenant in WEIGHTS:
                self.gpu_s[tenant] += self.held[tenant] * (at - self.since)
        self.since = at
        tenant = self.tenant_of[t.job_id]
        if t.previous is not None and t.previous.waiting:
            self.waiting[tenant] -= 1
        if t.state.waiting:
            self.waiting[tenant] += 1
        if t.previous is JobState.RUNNING:
            self.held[tenant] -= self.last_gpus.pop(t.job_id)
        if t.state is JobState.RUNNING:
            self.last_gpus[t.job_id] = t.gpus
            self.held[tenant] += t.gpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="muri/trace3")
    ap.add_argument("--cluster", default="n8g8")
    ap.add_argument("--policies", default="srtf")
    args = ap.parse_args()
    trace = load_trace(args.trace)
    names = sorted(WEIGHTS)
    jobs = [j.model_copy(update={"tenant": names[i % len(names)]})
            for i, j in enumerate(trace.jobs)]
    tenant_of = {j.job_id: j.tenant for j in jobs}
    config = TenantsConfig(tenants={t: TenantLimits(weight=w) for t, w in WEIGHTS.items()})
    print(f"{args.trace} on {args.cluster}: {len(jobs)} jobs dealt to {names}, weights "
          f"{[WEIGHTS[t] for t in names]}")
    for policy in args.policies.split(","):
        for tenants in (None, config):
            occ = Occupancy(tenant_of)
            seen = MetricsCore._on_transition

            def recording(core: MetricsCore, t: JobTransitionV1, at: float,
                          occ: Occupancy = occ, seen: Any = seen) -> None:
                occ.record(t, at)
                seen(core, t, at)

            t0 = time.perf_counter()
            with mock.patch.object(MetricsCore, "_on_transition", recording):
                result = asyncio.run(run_simulation(SimConfig(
                    policy=policy, jobs=jobs, cluster=load_cluster(args.cluster),
                    trace_name=trace.name, overhead=trace.default_overhead, tenants=tenants)))
            wall = time.perf_counter() - t0
            held = occ.gpu_s
            total = sum(held.values()) or 1.0
            per = result.summary["tenants"]
            assert isinstance(per, dict)
            shares = " ".join(f"{t}={held[t] / total:.3f}" for t in names)
            jcts = " ".join(f"{t}={per[t]['avg_jct_s']:,.0f}" for t in names)
            print(f"{policy:10} tenants={'yes' if tenants else 'no ':3} wall={wall:6.2f}s "
                  f"contended {occ.contended_s:,.0f} s, GPU-s share: {shares}  avg JCT: {jcts}  "
                  f"digest={str(result.summary['decision_digest'])[:12]}")


if __name__ == "__main__":
    main()
