"""The policy interface: a frozen snapshot in, a plan out.

A policy sees the cluster and every active job as immutable `JobView`s, walks them in its own
order and reserves GPUs through a `Fitter` (the placer's feasibility check for this cycle), so
what it plans is always placeable. It answers for every job it leaves waiting with a `Status`.

Policies are deterministic objects. The few that keep bookkeeping across cycles (Tiresias'
queue positions) keep it in the instance and change it only inside `plan`, so the same sequence
of snapshots always yields the same plans.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.status import Status, StatusCode

Replan = Literal["event", "round"]


@dataclass(frozen=True, slots=True)
class JobView:
    """One active job as a policy sees it at the snapshot's time."""

    spec: JobSpec
    running: bool
    iterations_done: float
    attained_s: float  # wall-clock seconds it has held GPUs (Tiresias' "executed time")
    preemptions: int = 0

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @property
    def remaining_iterations(self) -> float:
        return max(self.spec.iterations - self.iterations_done, 0.0)

    @property
    def remaining_s(self) -> float:
        return self.remaining_iterations * self.spec.iteration_time_s

    @property
    def attained_gpu_s(self) -> float:
        return self.attained_s * self.spec.gpus


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    cluster: ClusterSpec
    jobs: Mapping[str, JobView]  # every active (waiting or running) job
    running: tuple[JobView, ...]
    waiting_sizes: Mapping[int, int]  # how many waiting jobs need each GPU count

    def all_sizes(self) -> Counter[int]:
        sizes = Counter(self.waiting_sizes)
        for j in self.running:
            sizes[j.gpus] += 1
        return sizes


class Fitter(Protocol):
    """The placer's reservation state for one cycle (see services.placer.core)."""

    free_gpus: int
    monotone: bool

    def try_place(self, job_id: str, gpus: int) -> GpuSlots | None: ...

    def explain(self, gpus: int) -> str: ...


@dataclass
class Plan:
    """Which jobs run where after this cycle, and why the others wait."""

    run: dict[str, GpuSlots] = field(default_factory=dict)  # in priority order
    blocked: dict[str, Status] = field(default_factory=dict)  # examined, did not fit
    wakeup_at: float | None = None  # re-plan then even if nothing arrives or finishes


class Policy(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    placement: ClassVar[Literal["consolidated", "count"]] = "consolidated"
    replan: ClassVar[Replan] = "event"

    def job_added(self, job: JobView) -> None:  # noqa: B027 - optional hook
        """A job became active (admitted)."""

    def job_removed(self, job_id: str) -> None:  # noqa: B027 - optional hook
        """A job left for good (finished, failed)."""

    @abc.abstractmethod
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan: ...

    @abc.abstractmethod
    def waiting_status(self, job_id: str) -> Status:
        """Why a waiting job is waiting, as of the last plan (queue position where ordered)."""


def greedy_fill(
    order: Iterable[JobView], fit: Fitter, sizes: Counter[int], decided_by: str
) -> Plan:
    """Place jobs in priority order, all-or-nothing, skipping those that do not fit.

    This is the loop of the Tiresias and Muri simulators (no head-of-line blocking). `sizes`
    counts the GPU demands of every job in `order`; with a monotone fitter the walk stops as
    soon as no remaining job can fit, so a long queue costs nothing once the cluster is full.
    """
    plan = Plan()
    remaining = Counter(sizes)
    smallest_unfit = 1 << 30

    def nothing_fits() -> bool:
        limit = min(smallest_unfit, fit.free_gpus + 1)
        return not any(n > 0 and g < limit for g, n in remaining.items())

    for job in order:
        g = job.gpus
        remaining[g] -= 1
        if g >= smallest_unfit or g > fit.free_gpus:
            continue
        slots = fit.try_place(job.job_id, g)
        if slots is None:
            plan.blocked[job.job_id] = Status(
                code=StatusCode.WAITING_FOR_CONSOLIDATED_GPUS,
                reason=fit.explain(g),
                decided_by=decided_by,
            )
            if fit.monotone:
                smallest_unfit = g
        else:
            plan.run[job.job_id] = slots
            if fit.free_gpus == 0:
                break
        if fit.monotone and nothing_fits():
            break
    return plan


def status_for_waiting(job_id: str, plan: Plan | None, position: int | None, who: str) -> Status:
    if plan is not None and job_id in plan.blocked:
        st = plan.blocked[job_id]
        return Status(code=st.code, reason=st.reason, decided_by=st.decided_by,
                      queue_position=position)
    return Status(
        code=StatusCode.WAITING_FOR_PRIORITY,
        reason="higher-priority jobs hold the GPUs it needs",
        decided_by=who,
        queue_position=position,
    )
