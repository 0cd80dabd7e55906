"""Where ElasticFlow's planner is chosen: the fast path where it takes the jobs, else the
reference planner. Both give the same plans bit for bit; this is the one place that picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.elasticflow import fast, reference
from policies.elasticflow.model import Allotted, Growing, JobPlan, Need, Steps


class Planner(Protocol):
    """What `reference` and `fast` both provide (module-level functions)."""

    def plan_all(self, needs: Sequence[Need], now: float, total: int, slot: float
                 ) -> tuple[bool, dict[str, JobPlan], Steps]: ...

    def allocate_leftover(self, jobs: list[Growing], free: Steps, now: float, total: int,
                          slot: float, descending: bool = True) -> Steps: ...

    def plan_cycle(self, needs: Sequence[Need], now: float, total: int, slot: float, *,
                   descending: bool = True, all_met: bool = False) -> list[Allotted] | None: ...


def planner_for(needs: Sequence[Need]) -> Planner:
    """The compiled fast path if it takes these jobs (every level within its 64-GPU tables),
    else the reference planner."""
    return fast if fast.takes(needs) else reference
