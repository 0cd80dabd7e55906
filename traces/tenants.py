"""Tenants files from production traces (`loom gen-tenants`).

* From Helios' `cluster_gpu_number.csv` (GPUs of each VC per day): each VC on the chosen day
  (default: the last) becomes a tenant whose quota (`max_gpus`) and fair-share weight are its
  GPUs. VCs without GPUs that day are left out (a tenant with a quota of 0 would never run).
* From any trace (Philly's job log, whose VCs have no published quotas, or any other): each
  tenant's weight is its percentage of the trace's GPU time (GPUs x duration), with no quota:
  fair share in proportion to use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from schemas.tenants import TenantsConfig, parse_tenants
from traces.filters import TraceFilter
from traces.loader import load_trace
from traces.readers import helios
from traces.readers._stream import first_row

MIN_WEIGHT = 0.001


@dataclass(frozen=True)
class GeneratedTenants:
    """A tenants config with where it came from, and the tenants it could not include."""

    config: TenantsConfig
    source: str
    left_out: tuple[str, ...] = ()


def is_gpu_numbers(path: Path) -> bool:
    """Whether `path` looks like Helios' `cluster_gpu_number.csv` (a `date` column first)."""
    row = first_row(path) if path.is_file() else None
    return row is not None and len(row) > 1 and row[0] == "date"


def from_gpu_numbers(path: Path, date: str | None = None) -> GeneratedTenants:
    day, counts = helios.gpu_numbers(path, date)
    limits = {vc: {"weight": float(n), "max_gpus": n} for vc, n in counts.items() if n > 0}
    left_out = tuple(vc for vc, n in counts.items() if n == 0)
    config = parse_tenants({"tenants": limits}, str(path))
    return GeneratedTenants(config, f"{path.name}, {day}: quota and weight = the VC's GPUs",
                            left_out)


def from_trace(trace: str | Path, trace_filter: TraceFilter | str | None = None
               ) -> GeneratedTenants:
    loaded = load_trace(trace, trace_filter=trace_filter)
    used: dict[str, float] = {}
    for job in loaded.iter_jobs():
        used[job.tenant] = used.get(job.tenant, 0.0) + job.gpus * job.work_s
    total = sum(used.values()) or 1.0
    limits = {t: {"weight": max(MIN_WEIGHT, round(100.0 * u / total, 3))}
              for t, u in sorted(used.items())}
    config = parse_tenants({"tenants": limits}, str(loaded.path))
    return GeneratedTenants(config, f"{loaded.path.name} ({loaded.format}): weight = % of "
                                    "the trace's GPU time, no quota")


def generate(source: str | Path, date: str | None = None,
             trace_filter: TraceFilter | str | None = None) -> GeneratedTenants:
    """Tenants from a Helios GPU-numbers file or from a trace (see the module docstring)."""
    path = Path(source)
    if is_gpu_numbers(path):
        if trace_filter is not None:
            raise ValueError("--trace-filter applies to traces, not to a GPU-numbers file")
        return from_gpu_numbers(path, date)
    if date is not None:
        raise ValueError("--date applies to Helios' cluster_gpu_number.csv only")
    return from_trace(source, trace_filter)


def to_toml(config: TenantsConfig, comment: str = "") -> str:
    """A tenants file in TOML, one table per tenant (names quoted, so any Name is a key)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    for name, limits in config.tenants.items():
        if lines:
            lines.append("")
        lines.append(f"[tenants.{json.dumps(name)}]")
        values: Mapping[str, object] = limits.model_dump(exclude_none=True)
        for key, value in values.items():
            lines.append(f"{key} = {value!r}")
    return "\n".join(lines) + "\n"
