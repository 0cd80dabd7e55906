"""Gang admission, for every registered policy: a job gets all its GPUs or none.

Small random traces (rigid and elastic jobs, some with deadlines, two tenants, with and
without a tenants file) run through the real simulation; every plan the scheduler applies is
checked: a rigid job runs on exactly the GPUs it asked for, an elastic one on a count of its
scaling table within [min_gpus, max_gpus], and no GPU is planned twice except to the members
of one co-location group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from loom.simulate import SimConfig, run_simulation
from policies.base import Plan
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from schemas.tenants import TenantLimits, TenantsConfig
from services.scheduler.core import SchedulerCore
from tests.builders import cluster, make_job

SCALING = {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.0}
# One switch each: under consolidated placement a gang never spans switches, so a wider job
# than a switch would wait for ever (the scheduler admits by total GPUs only).
CLUSTERS = {"2x4": cluster(2, 4), "1x8": cluster(1, 8), "4x2": cluster(4, 2)}


@st.composite
def jobs(draw: st.DrawFn) -> list[JobSpec]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        b = make_job(f"j{i}").gpus(draw(st.sampled_from([1, 2, 3, 4, 8]))) \
            .iterations(draw(st.integers(20, 400))).submit(draw(st.integers(0, 200))) \
            .tenant(draw(st.sampled_from(["a", "b"])))
        if draw(st.booleans()):
            b.scaling(SCALING)
            b._fields["gpus"] = draw(st.sampled_from(sorted(SCALING)))
            b._fields["min_gpus"] = draw(st.sampled_from([1, 2]))
            b._fields["min_gpus"] = min(b._fields["min_gpus"], b._fields["gpus"])
        if draw(st.booleans()):
            b.deadline(b._fields["submit_time_s"] + draw(st.integers(100, 4000)))
        out.append(b.build())
    return out


tenant_files = st.one_of(st.none(), st.builds(
    lambda wa, qa, qq: TenantsConfig(tenants={
        "a": TenantLimits(weight=wa, max_gpus=qa, max_queued=qq)}),
    st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([None, 2, 4, 8]),
    st.sampled_from([None, 2])))


def violations(core: SchedulerCore, plan: Plan) -> list[str]:
    found = []
    owner: dict[tuple[str, int], str] = {}
    for jid, slots in plan.run.items():
        spec = core.jobs[jid].spec
        count = sum(len(gpus) for _, gpus in slots)
        if spec.scaling is None and count != spec.gpus:
            found.append(f"{jid}: rigid job asked for {spec.gpus} GPUs, planned {count}")
        if spec.scaling is not None and count not in spec.gpu_levels:
            found.append(f"{jid}: elastic job planned {count} GPUs, levels {spec.gpu_levels}")
        for node, gpus in slots:
            for g in gpus:
                other = owner.setdefault((node, g), jid)
                if other != jid and jid not in plan.groups.get(other, ()):
                    found.append(f"GPU {node}/{g} planned for {other} and {jid}")
    return found


@contextmanager
def checked_plans() -> Iterator[list[str]]:
    found: list[str] = []
    apply = SchedulerCore._apply

    def checking(core: SchedulerCore, plan: Plan, now: float) -> Any:
        found.extend(f"t={now}: {v}" for v in violations(core, plan))
        return apply(core, plan, now)

    with mock.patch.object(SchedulerCore, "_apply", checking):
        yield found


@pytest.mark.parametrize("policy", sorted(policies.REGISTRY))
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(trace=jobs(), where=st.sampled_from(sorted(CLUSTERS)), tenants=tenant_files)
def test_no_plan_splits_a_gang(policy: str, trace: list[JobSpec], where: str,
                               tenants: TenantsConfig | None) -> None:
    cl: ClusterSpec = CLUSTERS[where]
    with checked_plans() as found:
        result = asyncio.run(run_simulation(SimConfig(policy=policy, jobs=trace, cluster=cl,
                                                      tenants=tenants)))
    assert found == []
    assert result.summary["errors"] == 0
    # Everything admitted finishes: holds are never permanent.
    assert result.summary["finished"] + result.summary["rejected"] == len(trace)  # type: ignore[operator]
