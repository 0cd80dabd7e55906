"""Per-GPU-type throughput profiles (Gavel's throughputs JSON).

The file maps GPU type → "('<job type>', <GPUs>)" → {"null": iterations/s alone,
"('<other type>', <GPUs>)": [iterations/s of this job, of the other] when the two share the
GPUs}. Gavel also lists `*_unconsolidated` types (the same GPUs spread over servers); Loom
keeps them in the table but they are not GPU types of a cluster.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from traces.bundled import DATA_DIR
from traces.errors import TraceError

JobKey = tuple[str, int]  # (job type, GPUs)

DEFAULT_THROUGHPUTS = DATA_DIR / "gavel" / "simulation_throughputs.json"
_KEY = re.compile(r"^\('(.*)', (\d+)\)$")


def _parse_key(path: Path, text: str) -> JobKey:
    m = _KEY.match(text)
    if m is None:
        raise TraceError(path, None, text, "expected a key of the form \"('<job type>', <GPUs>)\"")
    return m.group(1), int(m.group(2))


def _rate(path: Path, where: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) \
            or value < 0:
        raise TraceError(path, None, where, f"expected a finite rate >= 0, got {value!r}")
    return float(value)


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


def load_throughputs(path: str | Path | None = None) -> ThroughputTable:
    """Read a throughputs JSON (default: Gavel's bundled simulation table)."""
    p = Path(path) if path is not None else DEFAULT_THROUGHPUTS
    try:
        raw = json.loads(p.read_text())
    except OSError as exc:
        raise TraceError(p, None, None, f"cannot read throughputs file: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(p, exc.lineno, None, f"invalid JSON: {exc.msg}") from None
    if not isinstance(raw, dict) or not raw:
        raise TraceError(p, None, None, "expected an object of GPU type → job → rates")
    isolated: dict[str, dict[JobKey, float]] = {}
    colocated: dict[str, dict[tuple[JobKey, JobKey], tuple[float, float]]] = {}
    for gpu_type, jobs in raw.items():
        if not isinstance(jobs, dict):
            raise TraceError(p, None, gpu_type, "expected an object of job → rates")
        iso = isolated[gpu_type] = {}
        co = colocated[gpu_type] = {}
        for job_text, rates in jobs.items():
            key = _parse_key(p, job_text)
            where = f"{gpu_type}/{job_text}"
            if not isinstance(rates, dict) or "null" not in rates:
                raise TraceError(p, None, where, "expected an object with a \"null\" rate")
            for other_text, value in rates.items():
                if other_text == "null":
                    iso[key] = _rate(p, where, value)
                    continue
                other = _parse_key(p, other_text)
                if not isinstance(value, list) or len(value) != 2:
                    raise TraceError(p, None, f"{where}/{other_text}",
                                     "expected [rate of this job, rate of the other]")
                co[(key, other)] = (_rate(p, where, value[0]), _rate(p, where, value[1]))
    return ThroughputTable(p, isolated, colocated)
