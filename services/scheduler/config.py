"""How a scheduler runs: its re-planning, overhead model, placement, faults and tenants."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

from numpy.typing import ArrayLike

import policies
from domain.overhead import OverheadModel, parse_overhead
from domain.placement import SCHEMES, Scheme
from policies.base import Policy, Replan
from schemas.tenants import TenantsConfig
from schemas.throughputs import ThroughputTable
from services.scheduler.liveness import LivenessConfig, RetryPolicy
from traces.distributions import load_size_distribution

DEFAULT_SLOT_S = 60.0  # ElasticFlow's scheduling slot in its Fig. 8 runs
DEFAULT_ROUND_S = 360.0


@dataclass(frozen=True)
class SchedulerConfig:
    replan: Replan = "event"
    round_s: float = DEFAULT_ROUND_S
    overhead: OverheadModel = field(default_factory=lambda: parse_overhead("none"))
    placement: Scheme | None = None  # None: the policy's own scheme
    profile: ThroughputTable | None = None  # co-located throughputs (Gavel's space sharing)
    # Rounds: re-plan as soon as a job finishes, so its GPUs do not idle until the round ends
    # (Gavel's simulator leaves them idle).
    free_at_once: bool = False
    seed: int = 0  # for policies set at run time (`loom set-policy`)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)  # lost nodes
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # failed trainers
    # Quotas and fair share in front of the policy (policies.mechanisms.admission); None: no limits.
    tenants: TenantsConfig | None = None
    # Job-size samples by name, for policies that rank by one (Tiresias-Gittins).
    load_job_sizes: Callable[[str], ArrayLike] = load_size_distribution
    # Start-time forecasts of waiting jobs (`forecasting`): after a cycle at most every
    # `forecast_every_s` seconds (published for metrics), and on a status request when the
    # last is older; None: none. They never change a decision.
    forecast_every_s: float | None = None
    forecast_horizon_s: float = 30 * 86400.0  # jobs not started by then get no forecast
    forecast_max_cycles: int = 20_000  # nor those not started within this many cycles
    # The queues' status (`queue_status`, for `loom queues`' series in Prometheus): published
    # after a cycle when it changed, or every `queue_status_every_s` seconds while cycles
    # run; None: never (simulations and replays). Never changes a decision.
    queue_status_every_s: float | None = None
    # Whether the node agents replay the failures a trace records (`JobSpec.fail_at`): a
    # simulation's do; a live cluster's trainers cannot fail on cue, so it refuses such jobs.
    replays_failures: bool = False

    def make_policy(self, name: str) -> Policy:
        """The policy `name`, set up for this run: at start and on `set-policy`."""
        return policies.make_configured(name, seed=self.seed, round_s=self.round_s,
                                        profile=self.profile, overhead=self.overhead,
                                        load_job_sizes=self.load_job_sizes)

    def __post_init__(self) -> None:
        # Times are floats whatever the caller passed. A round of 360 (an int) made the cycles'
        # times ints run from source and floats compiled (mypyc converts at the call), so the
        # same decisions gave two digests (their records print times with repr).
        for name in ("round_s", "forecast_every_s", "forecast_horizon_s",
                     "queue_status_every_s"):
            value = getattr(self, name)
            if value is None and name.endswith("every_s"):  # None: never
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number of seconds, not {value!r}")
            object.__setattr__(self, name, float(value))  # an int, or numpy's (repr: its type)
        if self.replan not in ("event", "round", "slot"):
            raise ValueError(f"replan must be 'event', 'round' or 'slot', not {self.replan!r}")
        if not 0 < self.round_s < math.inf:
            raise ValueError(f"round_s must be a positive number of seconds, not {self.round_s!r}")
        if self.forecast_every_s is not None and self.forecast_every_s < 0:
            raise ValueError("forecast_every_s must be 0 or more (None: no forecasts)")
        if self.queue_status_every_s is not None and self.queue_status_every_s < 0:
            raise ValueError("queue_status_every_s must be 0 or more (None: not published)")
        if self.forecast_horizon_s <= 0 or self.forecast_max_cycles < 1:
            raise ValueError("forecast_horizon_s and forecast_max_cycles must be positive")
        if self.placement is not None and self.placement not in SCHEMES:
            raise ValueError(f"unknown placement {self.placement!r}; known: {', '.join(SCHEMES)}")
