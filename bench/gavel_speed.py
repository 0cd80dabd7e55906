"""Loom's Gavel policies beside Gavel's simulator on the same trace, same machine, same run.

    .venv/bin/python bench/gavel_speed.py --trace T.trace                     # Loom only
    .venv/bin/python bench/gavel_speed.py --trace T.trace --gavel /path/gavel/scheduler \\
        --gavel-python /path/venv/bin/python [--gavel-pythonpath STUBS_DIR]

Make the trace with Gavel's generator or `python -m traces.gavel_generator` (identical
files apart from the command column). Both sides are timed without interpreter start-up and
imports: Loom's `run_simulation` on the memory bus, Gavel's `Scheduler.simulate`
(bench/gavel_driver.py). Gavel's average leaves out jobs its simulator marks failed; both
averages are printed with the job counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

from loom.simulate import SimConfig, run_simulation
from traces import load_cluster, load_trace

GAVEL_NAME = {"fifo-random": "fifo", "fifo-perf": "fifo_perf",
              "max-min-fairness": "max_min_fairness",
              "max-min-fairness-perf": "max_min_fairness_perf",
              "finish-time-fairness": "finish_time_fairness",
              "finish-time-fairness-perf": "finish_time_fairness_perf",
              "min-makespan": "min_total_duration_perf", "allox": "allox",
              "max-min-fairness-packed": "max_min_fairness_packed", "gandiva": "gandiva",
              "min-cost": "max_sum_throughput_normalized_by_cost_perf"}


def run_gavel(args: argparse.Namespace, policy: str) -> dict[str, float]:
    env = dict(os.environ)
    if args.gavel_pythonpath:
        env["PYTHONPATH"] = str(args.gavel_pythonpath)
    driver = Path(__file__).with_name("gavel_driver.py")
    out = subprocess.run([str(args.gavel_python), str(driver), str(args.gavel),
                          str(args.trace.resolve()), GAVEL_NAME[policy], args.cluster,
                          args.gpus_per_server], env=env, check=True, capture_output=True,
                         text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run_loom(args: argparse.Namespace, policy: str) -> tuple[float, float, int, float]:
    trace = load_trace(args.trace)
    per = args.gpus_per_server.split(":")[0]
    cfg = SimConfig(policy=policy, jobs=trace.jobs, cluster=load_cluster(args.cluster, per),
                    trace_name=trace.name)
    t = time.perf_counter()
    summary = asyncio.run(run_simulation(cfg)).summary
    return (time.perf_counter() - t, float(summary["avg_jct_s"]),  # type: ignore[arg-type]
            int(summary["finished"]),  # type: ignore[call-overload]
            float(summary["makespan_s"]))  # type: ignore[arg-type]


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

    print(f"{'policy':<26} {'loom s':>7} {'loom JCT':>10} {'makespan':>9} {'done':>5} "
          f"{'gavel s':>8} {'gavel JCT':>10} {'makespan':>9} {'done':>5} {'speed-up':>9} "
          f"{'ΔJCT':>7}")
    for policy in args.policies.split(","):
        loom_s, loom_jct, loom_done, loom_mk = run_loom(args, policy)
        cells = ""
        if args.gavel:
            g = run_gavel(args, policy)
            delta = 100 * (loom_jct / g["avg_jct_s"] - 1)
            cells = (f"{g['wall_s']:>8.2f} {g['avg_jct_s']:>10,.0f} {g['makespan_s']:>9,.0f} "
                     f"{int(g['completed']):>5} {g['wall_s'] / loom_s:>8.1f}x {delta:>+6.1f}%")
        print(f"{policy:<26} {loom_s:>7.2f} {loom_jct:>10,.0f} {loom_mk:>9,.0f} {loom_done:>5} "
              f"{cells}", flush=True)


if __name__ == "__main__":
    main()
