"""Scheduling policies behind one interface (`policies.base.Policy`): one per module, the large
ones a folder each; what several share is in `policies.mechanisms`.

`REGISTRY` is the explicit name → class table; `make(name)` builds a fresh instance.
"""

from __future__ import annotations

from collections.abc import Callable

from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from policies.allox import AlloX
from policies.base import Policy
from policies.chronus import Chronus
from policies.edf import Edf, EdfAccessControl
from policies.elasticflow import ElasticFlow
from policies.fifo import Fifo
from policies.fifo_gavel import FifoGavel
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
        FifoRandom, FifoPerf, FifoGavel, MinMakespan, MinCost, MinCostSlo, AlloX,
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


def policy_class(name: str) -> type[Policy]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownPolicy(name) from None


def make(name: str) -> Policy:
    return policy_class(name)()


def make_configured(name: str, *, seed: int, round_s: float,
                    profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                    load_job_sizes: Callable[[str], ArrayLike] | None = None) -> Policy:
    """A fresh policy set up for a run (its seed, round length, throughput profile and
    overhead model): how the scheduler builds one at start and on `set-policy`.

    `load_job_sizes` loads a job-size sample by name (`traces.distributions.
    load_size_distribution`); it is called only for a policy that ranks by one
    (`Policy.size_distribution`), which cannot be made without it."""
    cls = policy_class(name)
    job_sizes = None
    if cls.size_distribution is not None:
        if load_job_sizes is None:
            raise ValueError(f"policy {name!r} ranks jobs by the job-size sample "
                             f"{cls.size_distribution!r}: pass load_job_sizes")
        job_sizes = load_job_sizes(cls.size_distribution)
    policy = cls()
    policy.configure(seed=seed, round_s=round_s, profile=profile, overhead=overhead,
                     job_sizes=job_sizes)
    return policy
