"""Fixture builders for the queue layer's tests: a tenants file with queues, one cycle's walk."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from domain.placement import CyclePlacement
from policies.base import JobView, Snapshot
from policies.mechanisms.admission import TenantGate
from policies.mechanisms.fairshare import Usage
from policies.mechanisms.queues import QueueGate
from policies.mechanisms.quota import Book
from schemas.cluster import ClusterSpec
from schemas.job import JobSpec
from schemas.tenants import TenantsConfig, parse_tenants
from tests.builders import cluster, make_job


def queues(cohort: str | None = "c", half_life_s: float | None = None,
           **specs: dict[str, Any]) -> TenantsConfig:
    """Queues named after their one tenant, all in `cohort` unless a spec says otherwise."""
    return queue_file(specs, cohort, half_life_s)


def queue_file(specs: dict[str, dict[str, Any]], cohort: str | None = "c",
               half_life_s: float | None = None) -> TenantsConfig:
    body = {name: {"cohort": cohort, "tenants": [name], **fields}
            for name, fields in specs.items()}
    for fields in body.values():
        if fields["cohort"] is None:
            del fields["cohort"]
    life = {} if half_life_s is None else {"half_life_s": half_life_s}
    cohorts = {c: life for c in {f.get("cohort") for f in body.values()} if c is not None}
    return parse_tenants({"cohorts": cohorts, "queues": body}, "test.toml")


def job(jid: str, queue: str, gpus: int = 1, gpu_type: str | None = None) -> JobSpec:
    b = make_job(jid).tenant(queue).gpus(gpus)
    if gpu_type is not None:
        b._fields["gpu_type"] = gpu_type
    return b.build()


def ones(queue: str, n: int, start: int = 0) -> list[JobSpec]:
    return [job(f"{queue}{i}", queue) for i in range(start, start + n)]


@dataclass
class Cycle:
    """One cycle's walk: running jobs (with when their run began), then waiting ones."""

    config: TenantsConfig
    running: list[tuple[JobSpec, float]] = field(default_factory=list)
    waiting: list[JobSpec] = field(default_factory=list)
    now: float = 100.0
    cl: ClusterSpec = field(default_factory=lambda: cluster(2, 4))
    usage: dict[str, float] = field(default_factory=dict)
    order: list[str] | None = None  # walk order (job ids); default running then waiting

    def gate(self) -> QueueGate:
        views = {s.job_id: JobView.make(s, True, 0.0, 0.0, run_since=since)
                 for s, since in self.running}
        views |= {s.job_id: JobView.make(s, False, 0.0, 0.0) for s in self.waiting}
        snap = Snapshot(self.now, self.cl, MappingProxyType(views),
                        tuple(views[s.job_id] for s, _ in self.running))
        book = Book.of(self.config)
        inner = TenantGate(CyclePlacement(self.cl, "count"), snap, self.config,
                           groups=book.queue_of, capacity=book.capacity())
        usage = Usage(self.now, MappingProxyType(dict(self.usage)))
        return QueueGate(inner, snap, book, usage, {})

    def walk(self) -> tuple[list[str], QueueGate]:
        gate = self.gate()
        specs = {s.job_id: s for s, _ in self.running} | {s.job_id: s for s in self.waiting}
        order = self.order or list(specs)
        placed = [jid for jid in order if gate.try_place(jid, specs[jid].gpus) is not None]
        return placed, gate
