"""The one builder of a configured scheduler: simulations, live services and replays use it."""

from __future__ import annotations

import policies
from domain.overhead import parse_overhead
from policies.base import Replan
from schemas.cluster import ClusterSpec
from schemas.tenants import TenantsConfig
from schemas.throughputs import ThroughputTable
from services.scheduler.config import (
    DEFAULT_ROUND_S,
    DEFAULT_SLOT_S,
    SchedulerConfig,
)
from services.scheduler.core import SchedulerCore
from services.scheduler.liveness import LivenessConfig, RetryPolicy


def build_scheduler(policy_name: str, cluster: ClusterSpec, *, round_s: float | None = None,
                    overhead: str = "none", placement: str | None = None, seed: int = 0,
                    profile: ThroughputTable | None = None, free_at_once: bool = False,
                    liveness: LivenessConfig | None = None, retry: RetryPolicy | None = None,
                    tenants: TenantsConfig | None = None,
                    replays_failures: bool = False,
                    forecast_every_s: float | None = None,
                    queue_status_every_s: float | None = None) -> SchedulerCore:
    """The scheduler core with its policy configured, as simulations, live runs and replays
    build it. `round_s` sets a slotted policy's slot; it makes any other policy round-based.
    `replays_failures`: its node agents are simulated and replay jobs' recorded failures
    (a simulation, and the replay of one); a live cluster's are not. `forecast_every_s`:
    forecast waiting jobs' starts at most this often (None: never; `forecasting`).
    `queue_status_every_s`: publish the queues' status (None: never; `queue_status`)."""
    replan: Replan
    declared = policies.policy_class(policy_name).replan
    if declared == "slot":
        replan, period = "slot", round_s or DEFAULT_SLOT_S
    else:
        replan = "round" if round_s is not None else declared
        period = round_s or DEFAULT_ROUND_S
    config = SchedulerConfig(replan=replan, round_s=period, overhead=parse_overhead(overhead),
                             placement=placement,  # type: ignore[arg-type]  # checked above
                             profile=profile, free_at_once=free_at_once, seed=seed,
                             liveness=liveness or LivenessConfig(), retry=retry or RetryPolicy(),
                             tenants=tenants, replays_failures=replays_failures,
                             forecast_every_s=forecast_every_s,
                             queue_status_every_s=queue_status_every_s)
    return SchedulerCore(cluster, config.make_policy(policy_name), config)
