"""What the trainers' protocol records, as the cluster's tap keeps them, say of a job."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bench.gpuval.cluster import Cluster, Tap


# -- what the trainers' records say --------------------------------------------------------------
@dataclass
class Run:
    """One launch of a job: its `started` record, progress, checkpoints and end."""

    started: dict[str, Any]
    t_started: float
    progress: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None


def runs_of(records: list[tuple[float, dict[str, Any]]]) -> list[Run]:
    runs: list[Run] = []
    for t, rec in records:
        if rec["event"] == "started":
            runs.append(Run(rec, t))
        elif not runs:
            continue  # a record before any start (a failed launch): kept in the raw list
        elif rec["event"] == "progress":
            runs[-1].progress.append(rec)
        elif rec["event"] == "checkpointed":
            runs[-1].checkpoints.append(rec)
        else:
            runs[-1].end = rec
    return runs


def rate(progress: list[dict[str, Any]], lo: float = -math.inf,
         hi: float = math.inf) -> float | None:
    """Iterations per second between progress records (trainer clock), within [lo, hi]: from
    the first record on, so the warm-up before it (CUDA context, kernel loads) is left out."""
    pts = [(p["ts"], p["iteration"]) for p in progress
           if not p.get("fast_forward") and lo <= p["ts"] <= hi]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return float(pts[-1][1] - pts[0][1]) / float(pts[-1][0] - pts[0][0])


def job_result(cluster: Cluster, job_id: str, row: dict[str, Any]) -> dict[str, Any]:
    records = cluster.tap.records.get(job_id, [])
    runs = runs_of(records)
    out: dict[str, Any] = {"job_id": job_id, "state": row.get("state"),
                           "reason": row.get("reason"), "launches": len(runs),
                           "iterations": row.get("iterations")}
    done = [r["iteration"] for _, r in records if isinstance(r.get("iteration"), int)]
    out["iterations_done"] = max(done, default=0)
    # What happened, in order (progress left out): launches, checkpoints, stops, failures.
    t0 = records[0][0] if records else 0.0
    out["timeline"] = [f"{t - t0:.2f}s {r['event']}@{r.get('iteration')}"
                       + (" resumed" if r.get("resumed") else "")
                       for t, r in records if r["event"] != "progress"]
    failed = [r for _, r in records if r["event"] == "failed"]
    if failed:
        out["failure"] = failed[-1].get("reason")
    if not runs:
        return out
    last = runs[-1]
    out["device"] = last.started.get("device")
    out["startup_s"] = last.started.get("startup_s")
    out["it_per_s"] = rate(last.progress)
    if last.end is not None:
        out["end"] = last.end["event"]
        out["final_loss"] = last.end.get("loss")
        out["wall_s"] = last.end.get("wall_s")
        prof = last.end.get("profile")
        if prof and prof.get("iteration_s"):
            out["profile_it_per_s"] = 1.0 / prof["iteration_s"]
            out["stage_ms"] = {k: round(1e3 * prof[k], 3)
                               for k in ("data_s", "compute_s", "comm_s", "iteration_s")}
    pids = {s["trainers"].get(job_id) for s in cluster.samples if "trainers" in s} - {None}
    seen = [s for s in cluster.samples if "telemetry" in s and s["trainers"].get(job_id)]
    if seen:
        out["max_utilization"] = max(t["utilization"] for s in seen for t in s["telemetry"])
        out["max_memory_used_mib"] = max(t["memory_used_mib"] for s in seen
                                         for t in s["telemetry"])
        listed = {p for s in seen for t in s["telemetry"] for p in t["processes"]}
        out["pid_in_telemetry"] = bool(pids & listed)
    return out


def _trains_since(tap: Tap, job_id: str, since: float) -> bool:
    """A run of `job_id` started after `since` (monotonic) and has reported progress."""
    started = False
    for t, rec in tap.records.get(job_id, []):
        if rec["event"] == "started":
            started = t >= since
        elif rec["event"] == "progress" and started:
            return True
    return False
