"""Progress printed by an unmodified job: `LOOM_PROGRESS iteration=120 loss=0.53`.

A job that runs its own command (not Loom's trainer, not the SDK) can still tell Loom how far
it is by printing lines in this form on stdout (the keys in any order; `loss` optional; other
`key=value` pairs ignored), or in any form its submission describes with a regular expression
whose named groups are `iteration` and optionally `loss`. Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MARKER = "LOOM_PROGRESS"
_PAIR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


@dataclass(frozen=True, slots=True)
class PrintedProgress:
    iteration: int
    loss: float | None


def parse(line: str, pattern: re.Pattern[str] | None = None) -> PrintedProgress | None:
    """The progress a printed line reports, or None when it reports none (or is malformed)."""
    if pattern is not None:
        found = pattern.search(line)
        if found is None:
            return None
        fields = {k: v for k, v in found.groupdict().items() if v is not None}
    else:
        head, _, rest = line.strip().partition(" ")
        if head != MARKER:
            return None
        fields = dict(_PAIR.findall(rest))
    iteration = _int(fields.get("iteration"))
    if iteration is None:
        return None
    return PrintedProgress(iteration, _float(fields.get("loss")))


def compile_pattern(regex: str | None) -> re.Pattern[str] | None:
    return None if regex is None else re.compile(regex)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
