"""Tenants and their limits: weight (fair share), GPU quota and queued-jobs quota.

A tenants file (TOML or JSON) maps each tenant to its limits:

    [tenants.nlp]
    weight = 2          # share of contended GPUs, relative to the other tenants' weights
    max_gpus = 16       # GPUs its jobs may hold at once (jobs beyond it wait)
    max_queued = 100    # waiting jobs it may have (submissions beyond it are rejected)

A tenant the file does not name gets weight 1 and no limits. No file means no tenancy step at
all (see `policies.mechanisms.admission`).

The same file may group tenants into queues and queues into cohorts (`[queues.*]`,
`[cohorts.*]`: nominal quotas, borrowing and lending, `schemas.queues`, docs/queues.md). A file
without them means exactly what it meant before queues existed.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from schemas.job import MAX_GPUS, Name
from schemas.queues import MAX_QUEUES, CohortSpec, QueueSpec, check_hierarchy
from schemas.userinput import DuplicateKeyError, describe, loads_unique

MAX_TENANTS = 10_000


class TenantLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    max_gpus: int | None = Field(default=None, ge=0, le=MAX_GPUS)
    max_queued: int | None = Field(default=None, ge=0)


class TenantsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tenants: dict[Name, TenantLimits] = Field(default_factory=dict, max_length=MAX_TENANTS)
    cohorts: dict[Name, CohortSpec] = Field(default_factory=dict, max_length=MAX_QUEUES)
    queues: dict[Name, QueueSpec] = Field(default_factory=dict, max_length=MAX_QUEUES)

    @model_validator(mode="after")
    def _hierarchy(self) -> TenantsConfig:
        check_hierarchy(self.cohorts, self.queues)
        return self

    def limits(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, _UNLISTED)

    def queue_of(self, tenant: str) -> str | None:
        """The queue whose quotas a tenant's jobs draw on; None: in no queue."""
        for name, queue in self.queues.items():
            if tenant in queue.tenants:
                return name
        return None


_UNLISTED = TenantLimits()


class TenantsFileError(ValueError):
    """A tenants file that cannot be used; the message names the file, tenant and field."""


def parse_tenants(data: Any, source: str) -> TenantsConfig:
    """Validate decoded file contents; errors name `source`, the tenant and the field.

    Strictly, as typed (`weight = "2"` is refused, not read as 2): the contents go through
    JSON, where pydantic's strict mode still fills the tables."""
    if not isinstance(data, Mapping):
        raise TenantsFileError(f"{source}: expected a table of tenants, got {type(data).__name__}")
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:  # a TOML date, or a NaN weight
        raise TenantsFileError(f"{source}: {exc}; weights and limits are numbers") from None
    try:
        return TenantsConfig.model_validate_json(text, strict=True)
    except ValidationError as exc:
        problems = []
        for err in _merge_unions(exc.errors(include_url=False)):
            loc = [str(p) for p in err["loc"]]
            what = _SECTIONS.get(loc[0]) if loc else None
            if what is not None and len(loc) == 3 and loc[2] == "[key]":
                where = f"{what[0]} name {loc[1]!r}"
                problem = describe({**err, "loc": ()}).removeprefix("(top level): ")
            elif what is not None and len(loc) >= 3:
                where = f"{what[0]} {loc[1]!r}"
                problem = describe({**err, "loc": tuple(loc[2:])}, what[1])
            elif not loc and err["type"] == "value_error":  # the hierarchy check: its own words
                where, problem = "", describe(err).removeprefix("(top level): ")
            else:
                where = ""
                problem = describe(err, TenantsConfig.model_fields)
            problems.append(f"{where}: {problem}" if where else problem)
        raise TenantsFileError(f"{source}: " + "; ".join(problems)) from None


# Per section of the file: what one entry is called in messages, and its fields.
_SECTIONS = {"tenants": ("tenant", TenantLimits.model_fields),
             "queues": ("queue", QueueSpec.model_fields),
             "cohorts": ("cohort", CohortSpec.model_fields)}
_QUOTA_ALLOWED = "a whole number of GPUs from 0, or a table of GPU type = GPUs"


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _merge_unions(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """A quota is a number or a table: pydantic reports a bad one once per form (its location
    ending in the form's name); one error, in Loom's words, says it better. A table with a
    bad entry is reported by that entry alone."""
    def branch(err: ErrorDetails) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        loc = tuple(str(p) for p in err["loc"])
        if len(loc) >= 4 and loc[0] == "queues" and (loc[3].endswith("int")
                                                     or loc[3].startswith("dict[")):
            return loc[:3], loc[4:]
        return None

    in_tables = {b[0] for err in errors if (b := branch(err)) is not None and b[1]}
    out: list[ErrorDetails] = []
    merged: set[tuple[str, ...]] = set()
    for err in errors:
        b = branch(err)
        if b is None:
            out.append(err)
        elif b[1]:
            out.append(ErrorDetails(**{**err, "loc": b[0] + b[1]}))
        elif b[0] not in in_tables and b[0] not in merged:
            merged.add(b[0])
            out.append(ErrorDetails(**{**err, "loc": b[0], "type": "value_error",
                                       "msg": f"got {_shown(err['input'])}; allowed: "
                                              f"{_QUOTA_ALLOWED}"}))
    return out


def load_tenants(path: str | Path) -> TenantsConfig:
    """Read a tenants file: `.json` is JSON, anything else TOML."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TenantsFileError(f"{p}: cannot read tenants file: {exc.strerror}") from None
    try:
        if p.suffix.lower() == ".json":
            data = loads_unique(raw)
        else:
            data = tomllib.loads(raw.decode("utf-8"))  # TOML refuses a repeated key itself
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError,
            DuplicateKeyError) as exc:
        raise TenantsFileError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'TOML'}: "
                               f"{exc}") from None
    return parse_tenants(data, str(p))


def weighted_shares(capacity: float, demand: Mapping[str, float],
                    weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair split of `capacity` (progressive filling).

    Each tenant gets capacity in proportion to its weight, but never more than it demands;
    what a tenant cannot use is split again among the others by weight. Deterministic: tenants
    are visited in name order.
    """
    shares = {t: 0.0 for t in demand}
    open_ = sorted(t for t, d in demand.items() if d > 0)
    left = float(capacity)
    while open_ and left > 1e-9:
        total_w = sum(weights[t] for t in open_)
        sated = [t for t in open_ if demand[t] - shares[t] <= left * weights[t] / total_w]
        if not sated:
            for t in open_:
                shares[t] += left * weights[t] / total_w
            break
        for t in sated:
            left -= demand[t] - shares[t]
            shares[t] = float(demand[t])
        open_ = [t for t in open_ if t not in sated]
    return {t: (s if math.isfinite(s) else 0.0) for t, s in shares.items()}
