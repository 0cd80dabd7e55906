"""Loom's Muri policies beside the Muri simulator on the same trace, same machine, same run.

    .venv/bin/python bench/muri_speed.py                          # Loom only
    .venv/bin/python bench/muri_speed.py --muri /path/to/Muri/simulator

With --muri, Muri's own `run_sim.py` runs the same trace and schedule first (it needs cvxpy,
which Loom's venv has) and the speed-up is printed. Loom runs on the memory bus with Muri's
overhead model, event-driven, with each placement given (`default`: the policy's own;
`yarn`: Muri's first-fit re-pack).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loom.simulate import SimConfig, run_simulation
from traces import load_cluster, load_trace

MURI_NAME = {"muri-s": "multi-resource-blossom-same-gpu",
             "muri-l": "multi-resource-blossom-same-gpu-unaware", "srtf": "shortest",
             "srsf": "shortest-gpu", "tiresias": "dlas-gpu"}


def run_muri(sim_dir: Path, trace: str, schedule: str) -> tuple[float, float]:
    """(wall s, avg JCT) of Muri's simulator on trace-data/<trace>.csv."""
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        subprocess.run([sys.executable, "run_sim.py", "--cluster_spec=cluster_spec/n8g8.csv",
                        "--scheme=yarn", f"--trace_file=trace-data/{trace}.csv",
                        f"--schedule={schedule}", f"--log_path={out}", "--multi_resource", "4"],
                       cwd=sim_dir, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        with open(Path(out) / "job.csv") as f:
            rows = list(csv.DictReader(f))
        return wall, sum(float(r["JCT"]) for r in rows) / len(rows)


def run_loom(trace: str, policy: str, placement: str | None) -> tuple[float, float]:
    tr = load_trace(f"muri/{trace}")
    cfg = SimConfig(policy=policy, jobs=tr.jobs, cluster=load_cluster("n8g8"),
                    trace_name=tr.name, overhead="muri", placement=placement)
    t = time.perf_counter()
    summary = asyncio.run(run_simulation(cfg)).summary
    return time.perf_counter() - t, float(summary["avg_jct_s"])  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="trace3")
    ap.add_argument("--policies", default="muri-s,muri-l")
    ap.add_argument("--placements", default="default,yarn")
    ap.add_argument("--muri", type=Path, help="Muri's simulator/ directory, to run it too")
    args = ap.parse_args()
    print(f"{'trace':<8} {'policy':<8} {'placement':<9} {'loom s':>8} {'loom avg JCT':>14} "
          f"{'muri s':>8} {'muri avg JCT':>14} {'speed-up':>9} {'ΔJCT':>7}")
    for policy in args.policies.split(","):
        muri = run_muri(args.muri, args.trace, MURI_NAME[policy]) if args.muri else None
        for placement in args.placements.split(","):
            loom_s, loom_jct = run_loom(args.trace, policy,
                                        None if placement == "default" else placement)
            cells = (f"{muri[0]:>8.1f} {muri[1]:>14,.1f} {muri[0] / loom_s:>8.1f}x "
                     f"{100 * (loom_jct / muri[1] - 1):>+6.2f}%") if muri else ""
            print(f"{args.trace:<8} {policy:<8} {placement:<9} {loom_s:>8.2f} "
                  f"{loom_jct:>14,.1f} {cells}", flush=True)


if __name__ == "__main__":
    main()
