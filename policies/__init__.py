"""Scheduling policies, one per module, behind one interface (`policies.base.Policy`).

`REGISTRY` is the explicit name → class table; `make(name)` builds a fresh instance.
"""

from __future__ import annotations

from policies.allox import AlloX
from policies.base import Policy
from policies.chronus import Chronus
from policies.edf import Edf, EdfAccessControl
from policies.elasticflow import ElasticFlow
from policies.fifo import Fifo
from policies.fifo_rounds import FifoPerf, FifoRandom
from policies.finish_time_fairness import FinishTimeFairness, FinishTimeFairnessPerf
from policies.gandiva import Gandiva
from policies.gandiva_timeslice import GandivaTimeslice
from policies.gittins import TiresiasGittins
from policies.max_min_fairness import (
    MaxMinFairness,
    MaxMinFairnessPerf,
    MaxMinFairnessWaterFilling,
    MaxMinFairnessWaterFillingPerf,
)
from policies.max_min_fairness_packed import MaxMinFairnessPacked
from policies.min_cost import MinCost, MinCostSlo
from policies.min_makespan import MinMakespan
from policies.muri import MuriL, MuriS
from policies.pollux import Pollux
from policies.srsf import Srsf
from policies.srtf import Srtf
from policies.themis import Themis
from policies.tiresias import Las, Tiresias, TiresiasPollux
from schemas.throughputs import ThroughputTable

REGISTRY: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        Fifo, Srtf, Srsf, Las, Tiresias, TiresiasGittins, Themis, MuriS, MuriL, TiresiasPollux,
        # Gavel's heterogeneity-aware policies and their agnostic baselines (round-based)
        MaxMinFairness, MaxMinFairnessPerf, FinishTimeFairness, FinishTimeFairnessPerf,
        FifoRandom, FifoPerf, MinMakespan, MinCost, MinCostSlo, AlloX,
        MaxMinFairnessPacked, Gandiva, MaxMinFairnessWaterFilling,
        MaxMinFairnessWaterFillingPerf,
        # ElasticFlow's deadline baselines (slotted)
        Edf, EdfAccessControl, GandivaTimeslice, ElasticFlow,
        # Chronus' lease terms (round-based: one term per round)
        Chronus,
        # Pollux's goodput-optimised co-adaptive allocation (periodic, 60 s)
        Pollux,
    )
}


class UnknownPolicy(KeyError):
    def __str__(self) -> str:
        return f"unknown policy {self.args[0]!r}; registered: {', '.join(sorted(REGISTRY))}"


def make(name: str) -> Policy:
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise UnknownPolicy(name) from None
    return cls()


def make_configured(name: str, *, seed: int, round_s: float,
                    profile: ThroughputTable | None = None) -> Policy:
    """A fresh policy set up for a run (its seed, round length and throughput profile): how
    the scheduler builds one at start and on `set-policy`."""
    policy = make(name)
    policy.configure(seed=seed, round_s=round_s, profile=profile)
    return policy
