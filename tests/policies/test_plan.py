"""`Plan.stopped`: which running jobs a plan preempts, in the order they run (the order the
scheduler stops them in, and so the decision log's)."""

from __future__ import annotations

import pytest

from policies.base import Plan

ONE = (("n0", (0,)),)


@pytest.mark.parametrize(("plan", "stopped"), [
    pytest.param(Plan(run={"b": ONE, "x": ONE}), ["c", "a"], id="full-plan-stops-the-unlisted"),
    pytest.param(Plan(run={"x": ONE}, stay=True), [], id="in-place-stops-none"),
    pytest.param(Plan(run={"x": ONE}, stay=True, preempted={"a", "c"}), ["c", "a"],
                 id="kept-but-preempted-in-running-order"),
])
def test_a_plan_stops_its_preempted_jobs_in_running_order(plan: Plan, stopped: list[str]
                                                           ) -> None:
    assert plan.stopped(["c", "b", "a"]) == stopped
