"""Fixture builders shared by the tests: `make_job("a").gpus(8).submit(10).build()`."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loom.simulate import SimConfig, SimResult, run_simulation
from policies.base import JobView
from schemas.cluster import ClusterSpec
from schemas.events import JobTransition, envelope
from schemas.job import JobSpec, SubmitJob
from services.runtime.effects import Effect, Publish
from services.runtime.service import Core


@dataclass
class JobBuilder:
    _fields: dict[str, Any] = field(default_factory=dict)

    def gpus(self, n: int) -> JobBuilder:
        self._fields["gpus"] = n
        return self

    def iterations(self, n: int) -> JobBuilder:
        self._fields["iterations"] = n
        return self

    def iteration_time(self, s: float) -> JobBuilder:
        self._fields["iteration_time_s"] = s
        return self

    def runs_for(self, seconds: float) -> JobBuilder:
        """Solo run time: `seconds` iterations of one second."""
        self._fields["iterations"] = int(seconds)
        self._fields["iteration_time_s"] = 1.0
        return self

    def submit(self, t: float) -> JobBuilder:
        self._fields["submit_time_s"] = t
        return self

    def model(self, name: str) -> JobBuilder:
        self._fields["model"] = name
        return self

    def rates(self, **per_type: float) -> JobBuilder:
        """Iterations/s per GPU type (a profile); the v100 rate (or the first) sets the speed."""
        self._fields["throughputs"] = dict(per_type)
        ref = per_type.get("v100", next(iter(per_type.values())))
        self._fields["iteration_time_s"] = 1.0 / ref
        return self

    def scaling(self, levels: dict[int, float]) -> JobBuilder:
        """Elastic: iterations/s of the whole job at each GPU count, usable from 1 to the top."""
        self._fields.update(scaling=dict(levels), min_gpus=1, max_gpus=max(levels))
        return self

    def weight(self, w: float) -> JobBuilder:
        self._fields["weight"] = w
        return self

    def deadline(self, t: float, best_effort: bool = False) -> JobBuilder:
        self._fields["deadline_s"] = t
        self._fields["best_effort"] = best_effort
        return self

    def tenant(self, name: str) -> JobBuilder:
        self._fields["tenant"] = name
        return self

    def build(self) -> JobSpec:
        return JobSpec(**self._fields)


def make_job(job_id: str) -> JobBuilder:
    return JobBuilder({
        "job_id": job_id, "model": "resnet18", "gpus": 1, "iterations": 100,
        "iteration_time_s": 1.0, "submit_time_s": 0.0,
    })


def cluster(nodes: int = 2, gpus_per_node: int = 4, switches: int = 1) -> ClusterSpec:
    per_switch, rest = divmod(nodes, switches)
    assert rest == 0, "nodes must divide evenly into switches"
    return ClusterSpec.uniform(switches, per_switch, gpus_per_node)


def view(spec: JobSpec, running: bool = False, done: float = 0.0, attained: float = 0.0
         ) -> JobView:
    return JobView.make(spec, running, done, attained)


class ReadViews(dict[str, JobView]):
    """Views that note which jobs' were read (what a walk costs where views are made when
    read)."""

    def __init__(self, views: dict[str, JobView]) -> None:
        super().__init__(views)
        self.read: set[str] = set()

    def __getitem__(self, job_id: str) -> JobView:
        self.read.add(job_id)
        return super().__getitem__(job_id)


def simulate(jobs: Iterable[JobSpec], policy: str, cl: ClusterSpec | None = None,
             **kwargs: Any) -> SimResult:
    cfg = SimConfig(policy=policy, jobs=jobs, cluster=cl or cluster(), **kwargs)
    return asyncio.run(run_simulation(cfg))


_event_ids = itertools.count(1)


def deliver(core: Core, body: Any, now: float) -> list[Effect]:
    """`body` handed to a core at `now` in an envelope of its own, as its shell would."""
    env = envelope(body, event_id=f"ev{next(_event_ids)}", occurred_at=now, producer="test",
                   causation_id=None)
    return core.handle(env, now)


def transitions(effects: list[Effect]) -> list[JobTransition]:
    """The job transitions among a core's effects."""
    return [e.body for e in effects if isinstance(e, Publish)
            and isinstance(e.body, JobTransition)]


def submit(core: Core, spec: JobSpec, now: float = 0.0) -> list[JobTransition]:
    """Submit `spec` to a scheduler core at `now`: the transitions that follow at once."""
    return transitions(deliver(core, SubmitJob.from_spec(spec), now))
