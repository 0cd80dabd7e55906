"""Simulation speed: Muri trace2 (5,755 jobs) and trace3 (992 jobs), memory and NATS buses.

Each run is a fresh process so peak RSS is per run. Prints one row per (trace, policy, bus):
jobs/s, events/s, wall s, peak RSS, and the decision digest (equal across buses by design);
and first, per trace, how long reading it takes (the loader's second call in one process,
so imports are not counted; the best of --repeat).

    .venv/bin/python bench/sim_speed.py                      # srtf, both traces, both buses
    .venv/bin/python bench/sim_speed.py --policies srtf,tiresias --buses memory --repeat 3
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys

CHILD = """
import asyncio, json, sys, time
from loom.simulate import SimConfig, run_simulation
from traces import load_cluster, load_trace
trace, policy, bus = sys.argv[1:4]
t = load_trace(trace)
cfg = SimConfig(policy=policy, jobs=t.jobs, cluster=load_cluster("n8g8"), trace_name=t.name,
                overhead=t.default_overhead, bus=bus)
print(json.dumps(asyncio.run(run_simulation(cfg)).summary))
"""


LOAD = """
import sys, time
from traces import load_trace
load_trace(sys.argv[1])  # imports and the loader's first call
start = time.perf_counter()
load_trace(sys.argv[1])
print(time.perf_counter() - start)
"""


def load_s(trace: str) -> float:
    out = subprocess.run([sys.executable, "-c", LOAD, trace], check=True, capture_output=True,
                         text=True).stdout
    return float(out.strip().splitlines()[-1])


def run(trace: str, policy: str, bus: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, trace, policy, bus], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default="muri/trace3,muri/trace2")
    ap.add_argument("--policies", default="srtf")
    ap.add_argument("--buses", default="memory,nats")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the fastest is shown")
    args = ap.parse_args()
    print(f"# {platform.node()} · {platform.processor() or platform.machine()} · "
          f"Python {platform.python_version()}")
    for trace in args.traces.split(","):
        best_load = min(load_s(trace) for _ in range(args.repeat))
        print(f"reading {trace}: {best_load:.3f} s")
    print(f"{'trace':<13} {'policy':<9} {'bus':<7} {'jobs/s':>9} {'events/s':>10} "
          f"{'wall s':>8} {'RSS MB':>7}  digest")
    for trace in args.traces.split(","):
        for policy in args.policies.split(","):
            for bus in args.buses.split(","):
                best = min((run(trace, policy, bus) for _ in range(args.repeat)),
                           key=lambda s: float(s["wall_s"]))  # type: ignore[arg-type]
                wall = float(best["wall_s"])  # type: ignore[arg-type]
                print(f"{trace:<13} {policy:<9} {bus:<7} "
                      f"{int(best['jobs']) / wall:>9,.0f} "  # type: ignore[call-overload]
                      f"{int(best['events']) / wall:>10,.0f} "  # type: ignore[call-overload]
                      f"{wall:>8.2f} {best['peak_rss_mb']:>7}  "
                      f"{str(best['decision_digest'])[:16]}", flush=True)


if __name__ == "__main__":
    main()
