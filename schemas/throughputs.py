"""Per-GPU-type throughput profiles: how fast each job type runs on each GPU type, alone and
sharing GPUs with another job (Gavel's throughput tables; loaded by `traces.throughputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

JobKey = tuple[str, int]  # (job type, GPUs)


@dataclass(frozen=True)
class ThroughputTable:
    path: Path
    isolated: Mapping[str, Mapping[JobKey, float]]  # GPU type → job → it/s alone
    colocated: Mapping[str, Mapping[tuple[JobKey, JobKey], tuple[float, float]]]

    @cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self.isolated)

    def rates(self, job_type: str, gpus: int, gpu_types: tuple[str, ...]) -> dict[str, float]:
        """Iterations/s of one job alone on each of `gpu_types` (KeyError if unprofiled)."""
        key = (job_type, gpus)
        out = {}
        for t in gpu_types:
            per_type = self.isolated.get(t)
            if per_type is None:
                raise KeyError(f"GPU type {t!r} is not in {self.path.name} "
                               f"(it has {', '.join(self.gpu_types)})")
            if key not in per_type:
                raise KeyError(f"job type {job_type!r} at {gpus} GPUs is not profiled in "
                               f"{self.path.name}")
            out[t] = per_type[key]
        return out

    def pair(self, gpu_type: str, a: JobKey, b: JobKey) -> tuple[float, float] | None:
        """Iterations/s of a and b sharing GPUs of `gpu_type`, or None if not profiled."""
        return self.colocated.get(gpu_type, {}).get((a, b))

    @cached_property
    def job_types(self) -> tuple[str, ...]:
        """Every profiled job type, in file order."""
        seen: dict[str, None] = {}
        for per_type in self.isolated.values():
            for name, _ in per_type:
                seen.setdefault(name, None)
        return tuple(seen)
