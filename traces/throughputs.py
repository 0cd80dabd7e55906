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
from pathlib import Path

from schemas.throughputs import JobKey, ThroughputTable
from schemas.userinput import DuplicateKeyError, loads_unique

__all__ = ["DEFAULT_THROUGHPUTS", "JobKey", "ThroughputTable", "load_throughputs"]
from traces.bundled import DATA_DIR
from traces.errors import TraceError

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


def load_throughputs(path: str | Path | None = None) -> ThroughputTable:
    """Read a throughputs JSON (default: Gavel's bundled simulation table)."""
    p = Path(path) if path is not None else DEFAULT_THROUGHPUTS
    try:
        raw = loads_unique(p.read_text())
    except OSError as exc:
        raise TraceError(p, None, None, f"cannot read throughputs file: {exc.strerror}") from None
    except DuplicateKeyError as exc:
        raise TraceError(p, None, None, f"invalid JSON: {exc}") from None
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
