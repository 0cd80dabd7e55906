"""When the scheduler forecasts its waiting jobs' starts, from what, and where forecasts go.

- After a cycle, at most every `forecast_every_s` seconds of cluster time (0: after every
  cycle) and only while some job waits: a forecast from the state the cycle left, kept for
  status requests and published (`StartForecast` on `loom.sched.forecast`, split in parts of
  at most `PART` jobs), so the metrics service can score it against the starts that follow.
- On a status request, when the kept forecast is older than `forecast_every_s`, or a job
  waiting now began waiting after it was made (`covers`): a fresh one, kept but not
  published (a query publishes nothing).

Not every cycle: a forecast plays out every cycle until the last waiting job starts, which
costs far more than the cycle it follows. Forecasting is off unless configured, and a
forecast never changes a decision: it works on copies (`capture`), and what it publishes
only the metrics service reads, outside the decision digest. A policy that cannot be copied
(`copy.deepcopy`), or whose forecast fails, gets no more forecasts while it runs: that is
logged once, and the cycle goes on as if forecasts were off.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from policies.base import Policy
from schemas import subjects
from schemas.events import StartForecast
from services.runtime.effects import Effect, Publish
from services.runtime.logging import get_logger
from services.scheduler.forecast import (
    Forecast,
    ForecastInput,
    ForecastLimits,
    Timing,
    forecast,
)
from services.scheduler.jobs import JobRecord

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore

log = get_logger("loom.scheduler")

PART = 4096  # jobs per forecast message: about 150 KB, well under the 1 MiB event limit


@dataclass
class ForecastState:
    """The scheduler's latest forecast, when it last published one, and a policy that could
    not be forked or forecast (none is tried again while it runs)."""

    last: Forecast | None = None
    published_at: float | None = None
    refused: Policy | None = None


def capture(core: SchedulerCore, now: float) -> ForecastInput:
    """A copy of what the scheduler's next cycles depend on; the scheduler is left as it is.
    Raises whatever deep-copying the policy raises."""
    config = core.config
    jobs: dict[str, JobRecord] = {}
    for jid in core.views:
        rec = copy.copy(core.jobs[jid])
        if rec.run is not None:
            rec.run = copy.copy(rec.run)
        jobs[jid] = rec
    # Shared, not copied: what the copies only read (frozen specs and views, the cluster,
    # the run's tables), which also keeps a fork cheap.
    shared: dict[int, Any] = {id(v): v for v in core.views.values()}
    shared.update((id(v.spec), v.spec) for v in core.views.values())
    for obj in (core.cluster, core.topology, core.topology.type_of, config.profile,
                config.overhead, config.tenants):
        if obj is not None:
            shared[id(obj)] = obj
    policy = copy.deepcopy(core.policy, dict(shared))
    fit = None if core.fit is None else copy.deepcopy(core.fit, dict(shared))
    admission = None if core.admission is None else core.admission.fork()
    lost = core.faults.lost
    return ForecastInput(
        now=now, cluster=core.cluster, topology=core.topology, policy=policy, jobs=jobs,
        views=dict(core.views),
        timing=Timing(replan=config.replan, round_s=config.round_s,
                      free_at_once=config.free_at_once, last_cycle_at=core.last_cycle_at,
                      cycle_at=core.cycle_at, wakeup_at=core.wakeup_at, tick_at=core.tick_at),
        scheme=config.placement, fit=fit, moves=set(core.jobs.pending_moves()),
        cordoned=frozenset(core.drained | lost if lost else core.drained),
        overhead=config.overhead, profile=config.profile, tenants=config.tenants,
        admission=admission)


def make(core: SchedulerCore, now: float) -> Forecast | None:
    """A forecast of every waiting job's start from the scheduler's state at `now`, kept as
    its latest; None where the policy cannot be forked."""
    state = core.forecasts
    if state.refused is core.policy:
        return None
    config = core.config
    try:
        state.last = forecast(capture(core, now), ForecastLimits(config.forecast_horizon_s,
                                                                  config.forecast_max_cycles))
    except Exception as exc:  # a policy holding what cannot be copied (a solver handle), or
        # one that fails on a state only a forecast reaches: no forecast, never a failed cycle
        state.refused = core.policy
        log.warning("no start forecasts for this policy", policy=core.policy.name,
                    reason=f"{type(exc).__name__}: {exc}")
        return None
    return state.last


def waiting(core: SchedulerCore) -> bool:
    return len(core.views) > len(core.jobs.running)


def after_cycle(core: SchedulerCore, now: float) -> list[Effect]:
    """The forecast due after the cycle at `now` (see module docstring), published."""
    every = core.config.forecast_every_s
    state = core.forecasts
    if every is None or not waiting(core) or (
            state.published_at is not None and now < state.published_at + every):
        return []
    made = make(core, now)
    if made is None:
        return []
    state.published_at = now
    items = list(made.starts.items())
    parts = max(1, -(-len(items) // PART))
    return [Publish(subjects.START_FORECAST, StartForecast(
        at=now, cycle=core.cycle, starts=dict(items[i * PART:(i + 1) * PART]), part=i,
        parts=parts)) for i in range(parts)]


def on_request(core: SchedulerCore, now: float) -> Forecast | None:
    """The forecast a status request shows: the latest, or a fresh one if that is older than
    `forecast_every_s` or leaves out a job waiting now (None when forecasting is off)."""
    every = core.config.forecast_every_s
    if every is None:
        return None
    last = core.forecasts.last
    if (last is None or now >= last.at + every or not covers(core, last)) and waiting(core):
        return make(core, now)
    return last


def covers(core: SchedulerCore, last: Forecast) -> bool:
    """Whether `last` forecasts every job waiting now as it waits now: none began waiting
    after it was made (an arrival, a preemption or a reclaim since) nor came back to the
    policy (a resumed job). Otherwise that job would show no start ("?") until the forecast
    is `forecast_every_s` old; at most one forecast per status request remakes it."""
    for jid in core.views:
        if jid in core.jobs.running:
            continue
        since = core.jobs[jid].last
        if jid not in last.starts or (since is not None and since.at > last.at):
            return False
    return True


def expected_start(core: SchedulerCore, job_id: str) -> float | None:
    """A waiting job's start as the latest forecast has it (None: none, or not in it)."""
    last = core.forecasts.last
    if last is None:
        return None
    rec = core.jobs.get(job_id)
    if rec is None or rec.state is None or not rec.state.waiting:
        return None
    return last.starts.get(job_id)
