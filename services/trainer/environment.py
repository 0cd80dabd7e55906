"""What the launcher tells a trainer SDK job (`loom.sdk`): Loom's node agent, torchrun, or
nothing (a script run by hand). The node agent sets the `LOOM_*` variables
(`services/nodeagent/agent.py`), torchrun `RANK`, `WORLD_SIZE` and `MASTER_*`; docs/sdk.md
lists them. A bad value raises `SdkError` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.trainer_config import DEFAULT_RENDEZVOUS_TIMEOUT_S
from services.trainer.errors import SdkError

__all__ = ["Environment"]


@dataclass(frozen=True)
class Environment:
    """What the launcher tells this process (Loom's node agent, torchrun, or nothing)."""

    job_id: str = "local"
    rank: int = 0
    world_size: int = 1
    checkpoint_dir: Path | None = None
    iterations: int | None = None  # the job's total (the scheduler's number wins)
    batch_size: int | None = None  # the global batch the scheduler picked
    report: str = "none"  # stdout | fd:N | file:PATH | none
    report_every: int = 10
    grace_s: float | None = None
    rendezvous_timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S  # also each collective's

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Environment:
        env = os.environ if env is None else env
        under_loom = "LOOM_JOB_ID" in env
        rank = _int_var(env, "RANK", 0, low=0)
        world = _int_var(env, "WORLD_SIZE", 1, low=1)
        if rank >= world:
            raise SdkError(f"RANK={rank} must be below WORLD_SIZE={world}")
        ckpt = env.get("LOOM_CHECKPOINT_DIR")
        report = env.get("LOOM_REPORT", "stdout" if under_loom else "none")
        if not (report in ("stdout", "none") or (report.startswith("fd:") and report[3:].isdigit())
                or (report.startswith("file:") and len(report) > 5)):
            raise SdkError(f"LOOM_REPORT={report!r}: use stdout, fd:N, file:PATH or none")
        return cls(
            job_id=env.get("LOOM_JOB_ID", "local"), rank=rank, world_size=world,
            checkpoint_dir=Path(ckpt) if ckpt else None,
            iterations=_int_var(env, "LOOM_ITERATIONS", None, low=1),
            batch_size=_int_var(env, "LOOM_BATCH_SIZE", None, low=1),
            report=report, report_every=_int_var(env, "LOOM_REPORT_EVERY", 10, low=0) or 0,
            grace_s=_float_var(env, "LOOM_GRACE_S", None),
            rendezvous_timeout_s=_float_var(env, "LOOM_RENDEZVOUS_TIMEOUT_S",
                                            DEFAULT_RENDEZVOUS_TIMEOUT_S, above=0),
        )


def _float_var(env: Mapping[str, str], name: str, default: float | None, *,
               above: float | None = None) -> Any:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SdkError(f"{name}={raw!r} is not a number") from None
    if above is not None and value <= above:
        raise SdkError(f"{name}={value} must be above {above}")
    return value


def _int_var(env: Mapping[str, str], name: str, default: int | None, *, low: int) -> Any:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SdkError(f"{name}={raw!r} is not an integer") from None
    if value < low:
        raise SdkError(f"{name}={value} must be at least {low}")
    return value
