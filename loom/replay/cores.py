"""Fresh cores rebuilt from an event log's header."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

import policies
from loom.eventlog import EventLog, EventLogError
from schemas.cluster import ClusterSpec
from schemas.tenants import TenantsConfig
from schemas.throughputs import ThroughputTable
from services.placer.core import PlacerCore
from services.runtime.service import Core
from services.scheduler.build import build_scheduler
from traces.throughputs import load_throughputs

REPO = Path(__file__).resolve().parents[2]


def cluster_of(log: EventLog) -> ClusterSpec:
    if log.run.cluster is None:
        raise EventLogError(log.path, 0, "header has no cluster spec (export the log with "
                                         "--cluster, or pass --cluster to replay)")
    try:
        return ClusterSpec.model_validate(log.run.cluster)
    except ValidationError as exc:
        raise EventLogError(log.path, 0, f"header: invalid cluster spec: {exc}") from None


def profile_of(log: EventLog) -> ThroughputTable | None:
    name = log.run.throughputs
    if name is None:
        return None
    path = Path(name) if Path(name).is_absolute() else REPO / name
    if not path.is_file():
        raise EventLogError(log.path, 0, f"header: throughput profile {name} not found")
    return load_throughputs(str(path))


def tenants_of(log: EventLog) -> TenantsConfig | None:
    if log.run.tenants is None:
        return None
    try:
        return TenantsConfig.model_validate(log.run.tenants)
    except ValidationError as exc:
        raise EventLogError(log.path, 0, f"header: invalid tenants file: {exc}") from None


def fresh_cores(log: EventLog) -> list[Core]:
    """The scheduler (if the header names its policy) and the placer, as the run built them."""
    cluster = cluster_of(log)
    cores: list[Core] = []
    run = log.run
    if run.policy is not None:
        try:
            cores.append(build_scheduler(run.policy, cluster, round_s=run.round_s,
                                         overhead=run.overhead, placement=run.placement,
                                         seed=run.seed, profile=profile_of(log),
                                         free_at_once=run.free_at_once,
                                         tenants=tenants_of(log),
                                         # A simulated run's nodes replayed recorded failures.
                                         replays_failures=log.source == "sim"))
        except (ValueError, policies.UnknownPolicy) as exc:  # the header's values, refused
            raise EventLogError(log.path, 0, f"header: {exc}") from None
    cores.append(PlacerCore(cluster))
    return cores
