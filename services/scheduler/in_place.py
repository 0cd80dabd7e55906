"""How a cycle opens: in place, tried in place, or in full (the scheduler's cycles and a
forecast's copies of them decide alike).

In place, running jobs stay on their GPUs and only waiting jobs are placed: a cycle then costs
what it places, not what runs. Not when placement re-packs running jobs every cycle (yarn),
nor under tenants' quotas (whose gate may refuse one job and take another of the same size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from domain.placement import CyclePlacement
from policies.base import Plan, Policy, Snapshot


def open_cycle(policy: Policy, snap: Snapshot, may: bool,
               placement: Callable[[bool], CyclePlacement]
               ) -> tuple[Snapshot, CyclePlacement, Plan | None]:
    """The snapshot and placement the policy plans this cycle with, opened in place where
    the policy says its walk keeps every running job where it is (`running_stays`), or with
    the plan already made where its in-place attempt shows the same (`plan_in_place`); else
    opened in full (running jobs held for the walk), with no plan yet. `placement(in_place)`
    gives the cycle's placement state (asked again, it reopens the same state: nothing has
    moved since); `may`: whether in place is allowed at all."""
    in_place = may and policy.running_stays(snap)
    attempt = may and not in_place and policy.tries_in_place and bool(snap.running)
    fit = placement(in_place or attempt)
    if in_place:
        return replace(snap, in_place=True), fit, None
    if attempt:
        plan = policy.plan_in_place(replace(snap, in_place=True), fit)
        if plan is not None:
            return snap, fit, plan
        fit = placement(False)  # reopened in full: running jobs held, not placed
    return snap, fit, None
