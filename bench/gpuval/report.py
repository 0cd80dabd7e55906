"""The validation's report (OUT/gpu_validation.json, the summary) and its time budget."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TEARDOWN_S = 25.0  # kept out of the budget for stopping the cluster
MIN_STEP_S = 10.0  # a step with less budget left than this is skipped


# -- report ----------------------------------------------------------------------------------
@dataclass
class Report:
    mode: str
    out: Path
    data: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: list[tuple[str, str]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def measure(self, what: str, value: object) -> None:
        text = _fmt(value)
        self.summary.append((what, text))
        print(f"   {what}: {text}", flush=True)

    def finding(self, text: str) -> None:
        self.findings.append(text)
        print(f"   FINDING: {text}", flush=True)

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "written_at": datetime.now(UTC).isoformat(),
                "elapsed_s": round(time.monotonic() - self.started, 1), "steps": self.steps,
                "summary": [{"what": w, "value": v} for w, v in self.summary],
                "findings": self.findings, **self.data}

    def write(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "gpu_validation.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.as_json(), indent=2, default=str))
        tmp.replace(path)
        return path


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if value is None:
        return "-"
    return str(value)


@dataclass
class Budget:
    total_s: float
    t0: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.total_s - TEARDOWN_S - (time.monotonic() - self.t0)


async def run_step(report: Report, budget: Budget, name: str, cap_s: float,
                   work: Callable[[], Awaitable[None]], *, skip: str | None = None) -> bool:
    """Run one step within min(cap, budget left); record ok, skipped or the error and why."""
    print(f"== {name}", flush=True)
    t0 = time.monotonic()
    left = budget.left()
    if skip is None and left < MIN_STEP_S:
        skip = f"budget exhausted ({left:.0f} s left)"
    if skip is not None:
        report.steps[name] = {"ok": False, "skipped": skip}
        print(f"   skipped: {skip}", flush=True)
        report.write()
        return False
    timeout = min(cap_s, left)
    entry: dict[str, Any] = {"ok": False, "skipped": None, "error": None}
    try:
        await asyncio.wait_for(work(), timeout)
        entry["ok"] = True
    except TimeoutError:
        entry["error"] = f"timed out after {timeout:.0f} s"
        print(f"   ERROR: {entry['error']}", flush=True)
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["traceback"] = traceback.format_exc()
        print(f"   ERROR: {entry['error']}\n{entry['traceback']}", flush=True)
    entry["elapsed_s"] = round(time.monotonic() - t0, 2)
    report.steps[name] = entry
    report.write()
    return bool(entry["ok"])


def print_summary(report: Report) -> None:
    print(f"\n== summary ({report.mode}, {time.monotonic() - report.started:.0f} s)")
    width = max((len(w) for w, _ in report.summary), default=10)
    for name, step in report.steps.items():
        status = "ok" if step["ok"] else ("skipped: " + step["skipped"] if step.get("skipped")
                                          else "FAILED: " + str(step.get("error")))
        print(f"  step {name:<{width - 5}}  {status}")
    print()
    for what, value in report.summary:
        print(f"  {what:<{width}}  {value}")
    for text in report.findings:
        print(f"  FINDING: {text}")
    sys.stdout.flush()
