"""Themis speed: Loom's `themis` on a Muri trace (default trace3, n8g8, Muri's overhead model).

Prints Loom's wall time, cycles, LP solves (compiles, cache hits, and for the cycles whose first
solve failed: closed-form binding optimum, retry on scaled data, SCS, equal-weight fallback),
mean and max LP time per cycle (the first includes importing cvxpy) and the average JCT.
With `--muri DIR` (a Muri `simulator/` checkout) it also runs Muri's own
`run_sim.py --schedule=themis` on the same trace and prints the speed ratio and the JCT
difference; Muri's run takes minutes to hours.

    .venv/bin/python bench/themis_speed.py
    .venv/bin/python bench/themis_speed.py --traces muri/trace1,muri/trace3 \
        --muri /tmp/muri/simulator
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import policies
from loom.simulate import SimConfig, run_simulation
from policies.themis import Themis
from traces import load_cluster, load_trace


class _Recorded(Themis):
    """Themis that remembers its instances, to read the LP statistics after a run."""

    made: ClassVar[list[Themis]] = []

    def __init__(self) -> None:
        super().__init__()
        _Recorded.made.append(self)


def run_loom(trace_name: str, cluster: str) -> dict[str, object]:
    policies.REGISTRY["themis"] = _Recorded  # whether or not the registry lists it already
    trace = load_trace(trace_name)
    cfg = SimConfig(policy="themis", jobs=trace.jobs, cluster=load_cluster(cluster),
                    trace_name=trace.name, overhead=trace.default_overhead)
    _Recorded.made.clear()
    summary = asyncio.run(run_simulation(cfg)).summary
    stats = _Recorded.made[-1].lp.stats
    return {
        "wall_s": summary["wall_s"], "cycles": summary["cycles"], "jobs": summary["jobs"],
        "finished": summary["finished"], "avg_jct_s": summary["avg_jct_s"],
        "solves": stats.solves, "compiles": stats.compiles, "hits": stats.cache_hits,
        "fallbacks": stats.fallbacks, "exact": stats.exact, "rescaled": stats.rescaled,
        "secondary": stats.secondary,
        "inaccurate": stats.inaccurate,
        "lp_total_s": stats.total_s, "lp_mean_ms": stats.mean_s * 1e3,
        "lp_max_ms": stats.max_s * 1e3, "digest": summary["decision_digest"],
    }


_MURI_LINE = re.compile(r"Total jobs:\s*(\d+),\s*avg JCT:\s*([0-9.eE+-]+)")


def run_muri(muri_dir: Path, trace_name: str, cluster: str, timeout: float
             ) -> dict[str, float] | None:
    """Muri's simulator on the same trace; None if it timed out or printed no summary."""
    trace_file = muri_dir / "trace-data" / f"{trace_name.split('/')[-1]}.csv"
    spec = muri_dir / "cluster_spec" / f"{cluster}.csv"
    with tempfile.TemporaryDirectory(prefix="muri-themis-") as log:
        cmd = [sys.executable, "run_sim.py", f"--cluster_spec={spec}", "--scheme=yarn",
               f"--trace_file={trace_file}", "--schedule=themis", f"--log_path={log}",
               "--multi_resource", "4"]
        t0 = time.perf_counter()
        try:
            subprocess.run(cmd, cwd=muri_dir, check=True, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        wall = time.perf_counter() - t0
        out = subprocess.run([sys.executable, "calc.py", log], cwd=muri_dir, check=True,
                             capture_output=True, text=True).stdout
    m = _MURI_LINE.search(out)
    if m is None:
        return None
    return {"wall_s": wall, "jobs": float(m.group(1)), "avg_jct_s": float(m.group(2))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default="muri/trace3")
    ap.add_argument("--cluster", default="n8g8")
    ap.add_argument("--muri", type=Path, default=None,
                    help="Muri simulator directory: also run its themis for the speed ratio")
    ap.add_argument("--muri-timeout", type=float, default=4 * 3600.0)
    args = ap.parse_args()
    print(f"# {platform.node()} · {platform.processor() or platform.machine()} · "
          f"Python {platform.python_version()}")
    for name in args.traces.split(","):
        r = run_loom(name, args.cluster)
        print(f"{name} loom themis: wall {r['wall_s']:.2f} s, {r['cycles']} cycles, "
              f"{r['finished']}/{r['jobs']} finished, avg JCT {r['avg_jct_s']:.1f} s")
        print(f"  LP: {r['solves']} solves, {r['compiles']} compiles, {r['hits']} cache hits, "
              f"{r['fallbacks']} fallbacks, {r['exact']} closed-form, {r['rescaled']} rescaled, "
              f"{r['secondary']} by SCS, "
              f"{r['inaccurate']} flagged inaccurate; "
              f"{r['lp_total_s']:.2f} s total, mean {r['lp_mean_ms']:.2f} ms, "
              f"max {r['lp_max_ms']:.1f} ms per cycle; digest {str(r['digest'])[:16]}",
              flush=True)
        if args.muri is not None:
            m = run_muri(args.muri, name, args.cluster, args.muri_timeout)
            if m is None:
                print("  muri themis: no result (timeout or no summary)")
                continue
            wall, jct = float(r["wall_s"]), float(r["avg_jct_s"])  # type: ignore[arg-type]
            print(f"  muri themis: wall {m['wall_s']:.1f} s, avg JCT {m['avg_jct_s']:.1f} s; "
                  f"speed-up {m['wall_s'] / wall:.1f}x, "
                  f"JCT {100 * (jct / m['avg_jct_s'] - 1):+.1f} %", flush=True)


if __name__ == "__main__":
    main()
