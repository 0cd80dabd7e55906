"""Empirical job-size distributions: samples of per-job GPU-time, for size-aware policies.

Tiresias' Gittins-index policy ranks jobs by how likely they are to finish within the next
quantum of service, judged from a sample of past job sizes. Tiresias ships three such samples,
drawn from a production YARN cluster: `yarn-gput1000`, `yarn-gput5000` and `yarn-gput10000`
(1,001, 5,000 and 9,999 values). Each file is a CSV with the single column `duration`, one job's
GPU-time in seconds per row. The files are bundled unchanged in `traces/data/tiresias/`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from traces.bundled import DATA_DIR, _unknown
from traces.errors import TraceError
from traces.readers._csv import read_table

COLUMN = "duration"

_BUNDLED: dict[str, Path] = {
    f"yarn-gput{n}": DATA_DIR / "tiresias" / f"yarn-gput{n}.csv" for n in (1000, 5000, 10000)
}


def bundled_distributions() -> list[str]:
    """Names of the bundled size distributions, smallest sample first."""
    return list(_BUNDLED)


def resolve_distribution(name_or_path: str | Path) -> Path:
    """The file for a bundled name (`yarn-gput1000`, also spelled `tiresias/yarn-gput1000`)
    or a path. As for traces, a string that names a bundled distribution means that one,
    whatever the working directory; a `Path` is always a file."""
    if isinstance(name_or_path, str):
        bundled = _BUNDLED.get(name_or_path.removeprefix("tiresias/"))
        if bundled is not None:
            return bundled
        if not Path(name_or_path).is_file():
            raise _unknown("size distribution", name_or_path, list(_BUNDLED))
    return Path(name_or_path)


def load_size_distribution(name_or_path: str | Path) -> NDArray[np.float64]:
    """The job sizes (GPU-seconds) of a bundled distribution or CSV file, sorted ascending.

    The file must have exactly one column, `duration`, and at least one row; every value must be
    a positive finite number. Bad input raises `TraceError` naming the file, line and column.
    The returned array is read-only (float64).
    """
    path = resolve_distribution(name_or_path)
    table = read_table(path)
    if table.columns != (COLUMN,):
        raise TraceError(
            path, 1, None,
            f"expected the single column {COLUMN!r}; got {', '.join(map(repr, table.columns))}",
        )
    sizes = np.array([row.positive_float(COLUMN) for row in table.rows()], dtype=np.float64)
    if sizes.size == 0:
        raise TraceError(path, None, None, "no job sizes: the file has a header but no rows")
    sizes.sort()
    sizes.flags.writeable = False
    return sizes
