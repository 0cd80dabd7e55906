"""A walk skips the waiting jobs of a size that already failed this cycle
(`Fitter.fails_by_size`, policies/base.py `greedy_fill`): the same runs with and without the
skip, bit for bit, on clusters whose mixed node sizes rule out the monotone shortcut."""

from __future__ import annotations

from collections.abc import Collection

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.placement import CyclePlacement
from policies.base import Plan
from policies.mechanisms.walk import greedy_fill
from schemas.cluster import ClusterSpec, NodeSpec
from schemas.events import GpuSlots
from schemas.job import JobSpec
from tests.builders import make_job, simulate, view

POLICIES = ("fifo", "srtf", "srsf", "tiresias", "themis")

# Bursts of arrivals (queues form, and a cycle meets several jobs of one size), in sizes that
# the mixed machines fit unevenly.
traces = st.lists(
    st.tuples(st.sampled_from([1, 2, 3, 3, 4, 6, 8, 10]),  # GPUs
              st.integers(1, 400),  # seconds of work
              st.sampled_from([0, 0, 5, 30, 200])),  # submission
    min_size=1, max_size=50)


def mixed(small: int, large: int, per_switch: int = 4) -> ClusterSpec:
    """`small` 2-GPU and `large` 8-GPU machines, interleaved over switches (Philly's mix)."""
    sizes = [2] * small + [8] * large
    sizes = sizes[::2] + sizes[1::2]
    return ClusterSpec(name="mixed", nodes=tuple(
        NodeSpec(node_id=f"m{i}", switch_id=f"s{i // per_switch}", gpus=g)
        for i, g in enumerate(sizes)))


def _run(rows: list[tuple[int, int, int]], policy: str, cl: ClusterSpec) -> tuple[object, ...]:
    jobs = [make_job(f"j{i:02d}").gpus(g).runs_for(s).submit(t).build()
            for i, (g, s, t) in enumerate(rows)]
    s = simulate(jobs, policy, cl, overhead="muri").summary
    return s["decision_digest"], s["events"], s["cycles"], s["avg_jct_s"], s["rejected"]


@settings(max_examples=40, deadline=None)
@given(rows=traces, policy=st.sampled_from(POLICIES),
       shape=st.sampled_from([(4, 2), (6, 1), (2, 3)]))
def test_skipping_a_failed_size_decides_as_trying_every_job(
        rows: list[tuple[int, int, int]], policy: str, shape: tuple[int, int]) -> None:
    cl = mixed(*shape)
    fast = _run(rows, policy, cl)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(CyclePlacement, "fails_by_size", False)
        full = _run(rows, policy, cl)
    assert fast == full


class _Counting(CyclePlacement):
    """A placement that records the size of every gang the walk tries to place (a subclass,
    not a patched method: the compiled build's classes take no new attributes)."""

    def __init__(self, cluster: ClusterSpec) -> None:
        super().__init__(cluster)
        self.tried: list[int] = []

    def try_place(self, job_id: str, gpus: int, gpu_type: str | None = None,
                  within: Collection[str] | None = None) -> GpuSlots | None:
        self.tried.append(gpus)
        return super().try_place(job_id, gpus, gpu_type, within)


def _fill(jobs: list[JobSpec], by_size: bool) -> tuple[Plan, list[int]]:
    fit = _Counting(mixed(4, 1))
    fit.fails_by_size = by_size
    tried = fit.tried
    views = {j.job_id: view(j) for j in jobs}
    stream = iter([(i, j.job_id) for i, j in enumerate(jobs)])
    return greedy_fill([(None, stream)], views, fit, "test"), tried


def test_waiting_jobs_of_a_failed_size_are_not_tried_again_and_say_why() -> None:
    # Switch s0: machines of 2, 2, 8 and 2 GPUs; s1: one of 2. The 6-GPU job takes the 8-GPU
    # machine; then 10 GPUs are free but no 3 together (nor 2 whole + 1 in a switch of small
    # machines only): the first 3-GPU job fails, the other two are not tried.
    jobs = [make_job(f"j{i}").gpus(g).build() for i, g in enumerate([6, 3, 3, 1, 3])]
    plan, tried = _fill(jobs, by_size=True)
    assert tried == [6, 3, 1]
    assert list(plan.run) == ["j0", "j3"] and list(plan.blocked) == ["j1"]
    assert plan.unfit_sizes[3] == plan.blocked["j1"].reason
    _, tried_all = _fill(jobs, by_size=False)
    assert tried_all == [6, 3, 3, 1, 3]
