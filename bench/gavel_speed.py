"""Loom's Gavel policies beside Gavel's simulator on the same trace, same machine, same run.

    .venv/bin/python bench/gavel_speed.py --trace T.trace                     # Loom only
    .venv/bin/python bench/gavel_speed.py --trace T.trace --gavel /path/gavel/scheduler \\
        --gavel-python /path/venv/bin/python [--gavel-pythonpath STUBS_DIR]

Make the trace with Gavel's generator or `python -m traces.gavel_generator` (identical
files apart from the command column). Both sides are timed without interpreter start-up and
imports: Loom's `run_simulation` on the memory bus, Gavel's `Scheduler.simulate`
(bench/gavel_driver.py). Gavel's average leaves out jobs its simulator marks failed; both
averages are printed with the job counts. `ΔJCT` compares the two averages as printed; `Δsame`
compares them over the same jobs, those Gavel completed (Loom completes every job; Gavel's
simulator marks a job failed after five failed micro-tasks). `LP s` is the part of Loom's time
its policy spent in its solver (the run summary's `solver.total_s`), and `LP cap` the speed-up
Loom would reach if nothing else cost time: Gavel's seconds over those.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loom.simulate import SimConfig, run_simulation
from traces import load_cluster, load_trace

GAVEL_NAME = {"fifo-random": "fifo", "fifo-gavel": "fifo", "fifo-perf": "fifo_perf",
              "max-min-fairness": "max_min_fairness",
              "max-min-fairness-perf": "max_min_fairness_perf",
              "finish-time-fairness": "finish_time_fairness",
              "finish-time-fairness-perf": "finish_time_fairness_perf",
              "min-makespan": "min_total_duration_perf", "allox": "allox",
              "max-min-fairness-packed": "max_min_fairness_packed", "gandiva": "gandiva",
              "min-cost": "max_sum_throughput_normalized_by_cost_perf"}


def run_gavel(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    env = dict(os.environ)
    if args.gavel_pythonpath:
        env["PYTHONPATH"] = str(args.gavel_pythonpath)
    driver = Path(__file__).with_name("gavel_driver.py")
    out = subprocess.run([str(args.gavel_python), str(driver), str(args.gavel),
                          str(args.trace.resolve()), GAVEL_NAME[policy], args.cluster,
                          args.gpus_per_server], env=env, check=True, capture_output=True,
                         text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@dataclass(frozen=True)
class LoomRun:
    wall_s: float
    avg_jct_s: float
    finished: int
    makespan_s: float
    jct_by_line: dict[str, float | None]  # Loom names a Gavel job by its line in the trace
    solver_s: float  # of wall_s, in the policy's solver (0 for a policy that solves nothing)


def run_loom(args: argparse.Namespace, policy: str) -> LoomRun:
    trace = load_trace(args.trace)
    per = args.gpus_per_server.split(":")[0]
    cfg = SimConfig(policy=policy, jobs=trace.jobs, cluster=load_cluster(args.cluster, per),
                    trace_name=trace.name)
    t = time.perf_counter()
    result = asyncio.run(run_simulation(cfg))
    wall, summary = time.perf_counter() - t, result.summary
    return LoomRun(wall, float(summary["avg_jct_s"]),  # type: ignore[arg-type]
                   int(summary["finished"]),  # type: ignore[call-overload]
                   float(summary["makespan_s"]),  # type: ignore[arg-type]
                   {j.job_id: j.jct_s for j in result.jobs},
                   _solver_seconds(summary.get("solver")))


def _solver_seconds(stats: object) -> float:
    seconds = stats.get("total_s") if isinstance(stats, dict) else None
    return float(seconds) if isinstance(seconds, int | float) else 0.0


def same_jobs_delta(loom: dict[str, float | None], gavel: dict[str, float | None]) -> float:
    """Loom's average JCT over the jobs Gavel completed against Gavel's, in per cent."""
    if loom.keys() != gavel.keys():
        raise SystemExit(f"Loom ran {len(loom)} jobs and Gavel {len(gavel)}: not the same trace")
    theirs = {j: g for j, g in gavel.items() if g is not None}
    mine = [m for j in theirs if (m := loom[j]) is not None]
    if len(mine) < len(theirs):
        raise SystemExit("a job Gavel completed did not finish in Loom")
    return 100 * (sum(mine) / sum(theirs.values()) - 1)


def _cap(gavel_s: float, solver_s: float) -> str:
    """The speed-up Loom would reach if nothing but its solver cost time."""
    return f"{gavel_s / solver_s:.1f}x" if solver_s > 0 else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--policies", default="fifo-random,max-min-fairness,"
                    "max-min-fairness-perf,finish-time-fairness,finish-time-fairness-perf")
    ap.add_argument("--cluster", default="36:36:36")
    ap.add_argument("--gpus-per-server", default="4:4:4")
    ap.add_argument("--gavel", type=Path, help="Gavel's scheduler/ directory, to run it too")
    ap.add_argument("--gavel-python", type=Path, default=Path("python3"))
    ap.add_argument("--gavel-pythonpath", type=Path, help="e.g. Gavel's generated gRPC stubs")
    args = ap.parse_args()
    import cvxpy  # noqa: F401  - as Gavel's, Loom's import time is left out

    print(f"{'policy':<26} {'loom s':>7} {'LP s':>6} {'loom JCT':>10} {'makespan':>9} {'done':>5} "
          f"{'gavel s':>8} {'gavel JCT':>10} {'makespan':>9} {'done':>5} {'speed-up':>9} "
          f"{'ΔJCT':>7} {'Δsame':>7} {'LP cap':>7}")
    for policy in args.policies.split(","):
        loom = run_loom(args, policy)
        cells = ""
        if args.gavel:
            g = run_gavel(args, policy)
            delta = 100 * (loom.avg_jct_s / g["avg_jct_s"] - 1)
            same = same_jobs_delta(loom.jct_by_line, g["jct_by_line"])
            cells = (f"{g['wall_s']:>8.2f} {g['avg_jct_s']:>10,.0f} {g['makespan_s']:>9,.0f} "
                     f"{int(g['completed']):>5} {g['wall_s'] / loom.wall_s:>8.1f}x "
                     f"{delta:>+6.1f}% {same:>+6.1f}% {_cap(g['wall_s'], loom.solver_s):>7}")
        print(f"{policy:<26} {loom.wall_s:>7.2f} {loom.solver_s:>6.2f} {loom.avg_jct_s:>10,.0f} "
              f"{loom.makespan_s:>9,.0f} {loom.finished:>5} {cells}", flush=True)


if __name__ == "__main__":
    main()
