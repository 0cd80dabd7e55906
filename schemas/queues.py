"""Queues and cohorts in the tenants file: nominal quotas, borrowing, lending, reclaim.

The hierarchy is cohort → queue → tenant (docs/queues.md). A queue names the tenants whose jobs
it admits, its nominal quota of GPUs, how much more it may borrow from the idle quota of the
other queues in its cohort, and how much of its own idle quota it lends:

    [cohorts.research]
    half_life_s = 604800      # usage half-life for fair share between its queues (7 days)

    [queues.nlp]
    cohort = "research"
    tenants = ["nlp", "speech"]
    nominal = 16              # GPUs of any type; or per type: nominal = { a100 = 8, v100 = 8 }
    borrowing_limit = 8       # at most 8 GPUs beyond its nominal (absent: no limit)
    lending_limit = 12        # at most 12 of its idle GPUs lent out (absent: all of them)
    weight = 2                # share of contended GPUs, against its decayed usage
    priority = 0              # higher first for contended GPUs; `reclaim = "lower_priority"`
    min_runtime_s = 600       # its running jobs are not reclaimed before this
    reclaim = "any"           # take lent GPUs back from: "any" borrower, "lower_priority", "never"

The models here are the file's shape; `check_hierarchy` is what ties them together (each
queue's cohort exists, each tenant is in at most one queue, quotas agree in form). The queue
rules themselves are `policies.mechanisms.queues`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.job import MAX_GPUS, Name

ANY_TYPE = "*"  # the resource a whole-number quota counts: GPUs of any type
DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0  # Slurm's PriorityDecayHalfLife default
MAX_QUEUES = 10_000

Gpus = Annotated[int, Field(ge=0, le=MAX_GPUS)]
# A quota: GPUs of any type (a whole number) or a table of GPU type → GPUs.
Quota = Gpus | dict[Name, Gpus]
Reclaim = Literal["never", "lower_priority", "any"]


class CohortSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    half_life_s: float = Field(default=DEFAULT_HALF_LIFE_S, gt=0, le=1e10,
                               allow_inf_nan=False)


class QueueSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cohort: Name | None = None  # None: alone, it neither borrows nor lends
    tenants: tuple[Name, ...] = ()
    nominal: Quota = 0
    borrowing_limit: Quota | None = None  # None: up to what the cohort can lend
    lending_limit: Quota | None = None  # None: all its idle nominal quota
    weight: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    min_runtime_s: float = Field(default=0.0, ge=0, le=1e10, allow_inf_nan=False)
    reclaim: Reclaim = "any"

    @property
    def typed(self) -> bool:
        """Quotas per GPU type (a table), rather than GPUs of any type."""
        return isinstance(self.nominal, dict)

    def resources(self) -> tuple[str, ...]:
        """What its quotas count: its GPU types in the file's order, or `ANY_TYPE`."""
        return tuple(self.nominal) if isinstance(self.nominal, dict) else (ANY_TYPE,)

    def nominal_of(self, resource: str) -> int:
        return _amount(self.nominal, resource, 0) or 0

    def borrowing_of(self, resource: str) -> int | None:
        return None if self.borrowing_limit is None else \
            _amount(self.borrowing_limit, resource, None)

    def lendable_of(self, resource: str) -> int:
        """How much of its nominal quota of `resource` the cohort may borrow."""
        nominal = self.nominal_of(resource)
        if self.lending_limit is None:
            return nominal
        limit = _amount(self.lending_limit, resource, None)
        return nominal if limit is None else min(limit, nominal)


def _amount(quota: int | dict[str, int], resource: str, absent: int | None) -> int | None:
    if isinstance(quota, dict):
        return quota.get(resource, absent)
    return quota if resource == ANY_TYPE else absent


class HierarchyError(ValueError):
    """Queues and cohorts that do not fit together; the message names the queue and field."""


def check_hierarchy(cohorts: Mapping[str, CohortSpec], queues: Mapping[str, QueueSpec]) -> None:
    """Refuse a file whose queues do not fit together (HierarchyError, first problem only)."""
    seen: dict[str, str] = {}  # tenant → its queue
    form: dict[str, tuple[str, bool]] = {}  # cohort → (first queue, its quotas are typed)
    for name, q in queues.items():
        where = f"queue {name!r}"
        if q.cohort is not None and q.cohort not in cohorts:
            known = ", ".join(map(repr, cohorts)) or "none"
            raise HierarchyError(f"{where}: cohort: {q.cohort!r} is not a cohort of the file "
                                 f"([cohorts.*]: {known})")
        for tenant in q.tenants:
            other = seen.setdefault(tenant, name)
            if other != name:
                raise HierarchyError(f"{where}: tenants: {tenant!r} is already in queue "
                                     f"{other!r}; a tenant belongs to one queue")
        for field in ("borrowing_limit", "lending_limit"):
            limit = getattr(q, field)
            if limit is None:
                continue
            if q.cohort is None:
                raise HierarchyError(f"{where}: {field}: a queue in no cohort neither borrows "
                                     "nor lends; set its cohort or drop the limit")
            if isinstance(limit, dict) != q.typed:
                raise HierarchyError(f"{where}: {field}: {_form(limit)}, but its nominal "
                                     f"quota is {_form(q.nominal)}; use the same form")
            if isinstance(limit, dict) and isinstance(q.nominal, dict):
                extra = [t for t in limit if t not in q.nominal]
                if extra:
                    raise HierarchyError(f"{where}: {field}: GPU type {extra[0]!r} has no "
                                         "nominal quota in this queue")
        if q.lending_limit is not None:
            for r in q.resources():
                limit = _amount(q.lending_limit, r, None)
                if limit is not None and limit > q.nominal_of(r):
                    what = "" if r == ANY_TYPE else f" of {r}"
                    raise HierarchyError(f"{where}: lending_limit: {limit}{what} is more than "
                                         f"its nominal quota ({q.nominal_of(r)})")
        if q.cohort is not None:
            first, typed = form.setdefault(q.cohort, (name, q.typed))
            if typed != q.typed:
                raise HierarchyError(
                    f"{where}: nominal: {_form(q.nominal)}, but queue {first!r} of cohort "
                    f"{q.cohort!r} counts {_form(queues[first].nominal)}; one cohort's "
                    "queues count GPUs the same way")


def _form(quota: int | dict[str, int]) -> str:
    return "GPUs per type (a table)" if isinstance(quota, dict) else "GPUs of any type (a number)"
