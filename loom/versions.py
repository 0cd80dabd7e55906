"""Which versions of Python, Loom and the libraries that make decisions a run used.

Event logs and `summary.json` record them, and a replay that diverges names those that
differ from the recording: another solver version may return another of several equal optima.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
from collections.abc import Mapping

# What makes decisions besides Loom's own code: the solvers behind cvxpy (Clarabel, HiGHS,
# SCS), scipy (AlloX's assignment, Pollux's model fit), numpy, numba (ElasticFlow's kernel)
# and rustworkx (Muri's matching). Another version may return another of several equal
# optima (docs/replay.md, "Solvers and determinism"), so logs and summaries say which made
# them.
DECISION_LIBRARIES = ("numpy", "scipy", "cvxpy", "highspy", "clarabel", "scs", "numba",
                      "rustworkx")
LOOM_DISTRIBUTION = "loom-scheduler"
NOT_INSTALLED = "not installed"
Versions = dict[str, str]


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


@functools.cache
def _running() -> tuple[tuple[str, str], ...]:
    names = [("python", platform.python_version()), ("loom", _installed(LOOM_DISTRIBUTION))]
    names += [(lib, _installed(lib)) for lib in DECISION_LIBRARIES]
    return tuple(names)


def running_versions() -> Versions:
    """Versions of Python, Loom and the decision-making libraries in this process."""
    return dict(_running())


def version_changes(recorded: Mapping[str, str] | None,
                    running: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(name, recorded, running) for each version that differs; a name the recording lacks
    is unknown, not a difference."""
    if not recorded:
        return []
    return [(name, recorded[name], now) for name, now in running.items()
            if name in recorded and recorded[name] != now]


def _listed(versions: Mapping[str, str]) -> str:
    return ", ".join(f"{name} {v}" for name, v in versions.items())


def versions_note(recorded: Mapping[str, str] | None, running: Mapping[str, str]) -> list[str]:
    """What a divergent replay says about versions: which differ from the recording (a
    solver upgrade named as the likely cause), that none do, or that the log does not say."""
    if not recorded:
        return ["versions: the log does not say which made its decisions (a live log, or one "
                f"written before logs carried them); running {_listed(running)}"]
    changes = version_changes(recorded, running)
    if not changes:
        return ["versions: as recorded, so no library upgrade explains this divergence"]
    lines = [f"versions: recorded with {name} {old}, running {new}" for name, old, new in changes]
    if any(name in DECISION_LIBRARIES for name, _, _ in changes):
        lines.append("  another version of a solver or numeric library is the likely cause: "
                     "where several solutions are optimal it may return another "
                     "(docs/replay.md, \"Solvers and determinism\")")
    return lines
