"""Simulation at production scale: wall, CPU, µs of CPU per event, events/s and jobs/s (of CPU
time) and peak RSS.

Each run is a fresh process (peak RSS is the run's own; CPU time is the simulation's own,
steadier than wall time on a shared VM) that builds its trace
deterministically, then simulates it on the memory bus through the same services as `loom
sim`; its cores compiled where `scripts/setup` built them (domain/compiled.py; the header says
which), or from source with `LOOM_PURE_PYTHON=1`. Traces:

- `overlay:TRACE` (default `overlay:muri/trace2`): copies of a bundled trace laid over each
  other (the k-th copy's jobs are `<id>-c<k>` but the first's, at the same times: one copy
  is the trace itself), as many as `--jobs` needs;
  on a cluster of `--gpus` GPUs, 8 per node with the trace's own node size, up to 8 nodes a
  switch (Muri's n8g8 copied).
- `gavel`: Gavel's generator (`traces.gavel_generator`, seeded), `--lam` seconds between
  arrivals, on a V100:P100:K80 cluster split evenly, 8 GPUs a server.
- `elasticflow`: ElasticFlow's generator (seeded, A100, deadlines), on A100 nodes of 8.

    .venv/bin/python bench/scale.py --policies srtf --jobs 5755 --gpus 64
    .venv/bin/python bench/scale.py --policies srtf,tiresias --jobs 92080 --gpus 1024,10000
    .venv/bin/python bench/scale.py --source gavel --policies max-min-fairness-perf \\
        --jobs 100000 --gpus 10000 --round-s 360
    .venv/bin/python bench/scale.py --policies srtf --policy-time   # + the policy's share

`--policy-time` times the policy's interface methods (what the scheduler calls: plans, hooks,
admission; the walks and placements they make included) and prints their µs per event as a
last column: the part of an event a faster core could not take off while policies stay Python.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from typing import Any

from domain import compiled

CHILD = r"""
import asyncio, itertools, json, math, sys, time
from loom.simulate import SimConfig, run_simulation
from policies import REGISTRY
from schemas.cluster import ClusterSpec
from traces import load_cluster, load_trace

source, policy, jobs, gpus, seed, lam, round_s, stream, policy_time = sys.argv[1:10]
jobs, gpus, seed, lam = int(jobs), int(gpus), int(seed), float(lam)
round_s = float(round_s) if round_s != "-" else None
t0 = time.perf_counter()
profile, overhead = None, "none"
if source.startswith("overlay:"):
    base = load_trace(source.split(":", 1)[1])
    copies = math.ceil(jobs / len(base.jobs))
    # Copies of each job one after the other: still in submission order. Streamed, each copy
    # is made as the injector reaches it (its cost is then in the run's CPU time).
    specs = (j.model_copy(update={"job_id": f"{j.job_id}-c{k}"}) if k else j
             for j in base.jobs for k in range(copies))
    specs = itertools.islice(specs, jobs) if stream == "1" else list(specs)[:jobs]
    node = load_cluster("n8g8").nodes[0]
    nodes = max(1, gpus // node.gpus)
    per_switch = max(d for d in range(1, 9) if nodes % d == 0)  # exactly `gpus` GPUs
    cluster = ClusterSpec.uniform(nodes // per_switch, per_switch, node.gpus,
                                  cpus_per_node=node.cpus, mem_gb_per_node=node.mem_gb,
                                  name=f"n{nodes}g{node.gpus}")
    overhead, profile, name = base.default_overhead, base.profile, f"{base.name}x{copies}"
elif source in ("gavel", "elasticflow"):
    import tempfile
    from pathlib import Path
    folder = Path(tempfile.mkdtemp())
    if source == "gavel":
        from traces.gavel_generator import generate_gavel_jobs, write_gavel_trace
        path = write_gavel_trace(generate_gavel_jobs(jobs, lam, seed), folder / "trace")
        third = gpus // 24 * 8  # whole servers of each type; the last type takes the rest
        cluster = load_cluster(f"{third}:{third}:{gpus - 2 * third}", 8)
    else:
        from traces.elasticflow_generator import (generate_elasticflow_jobs,
                                                  write_elasticflow_trace)
        path = write_elasticflow_trace(generate_elasticflow_jobs(jobs, lam, seed),
                                       folder / "trace.csv")
        cluster = ClusterSpec.uniform(math.ceil(gpus / 64), 8, 8, gpu_type="A100",
                                      name=f"n{gpus // 8}g8")
    base = load_trace(path)
    specs, overhead, profile, name = list(base.jobs), base.default_overhead, base.profile, source
else:
    raise SystemExit(f"unknown source {source!r}: overlay:TRACE, gavel or elasticflow")
built = time.perf_counter() - t0
policy_s = [0.0]
# An unknown policy is left to SimConfig, which names the registered ones.
if policy_time == "1" and policy in REGISTRY:
    # Seconds inside the policy's methods, outermost calls (one thread: its CPU).
    import inspect
    from policies.base import Policy
    depth = [0]
    def timed(fn):
        def call(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0], start = 1, time.perf_counter()  # a tenth of process_time's cost
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] = 0
                policy_s[0] += time.perf_counter() - start
        return call
    cls = REGISTRY[policy]
    for name in dir(Policy):  # the interface the scheduler calls, not the walk's own helpers
        fn = inspect.getattr_static(cls, name)  # as defined: a static or class method is left
        if not name.startswith("_") and inspect.isfunction(fn):
            setattr(cls, name, timed(fn))
cfg = SimConfig(policy=policy, jobs=specs, cluster=cluster, trace_name=name, overhead=overhead,
                profile=profile, round_s=round_s, seed=seed, job_count=jobs)
cpu0 = time.process_time()
summary = asyncio.run(run_simulation(cfg)).summary
print(json.dumps({"build_s": built, "cpu_s": time.process_time() - cpu0,
                  "policy_s": policy_s[0] if policy_time == "1" else None,
                  "gpus": cluster.total_gpus, "jobs": cfg.total_jobs,
                  **{k: summary[k] for k in ("wall_s", "events", "cycles", "peak_rss_mb",
                                             "finished", "avg_jct_s", "decision_digest")}}))
"""


def run(source: str, policy: str, jobs: int, gpus: int, seed: int, lam: float,
        round_s: float | None, timeout_s: float, stream: bool = False,
        policy_time: bool = False) -> dict[str, Any]:
    argv = [sys.executable, "-c", CHILD, source, policy, str(jobs), str(gpus), str(seed),
            str(lam), "-" if round_s is None else str(round_s), "1" if stream else "0",
            "1" if policy_time else "0"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:g} s"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="overlay:muri/trace2",
                    help="overlay:TRACE, gavel or elasticflow (default overlay:muri/trace2)")
    ap.add_argument("--policies", default="srtf,tiresias")
    ap.add_argument("--jobs", default="5755", help="comma-separated job counts")
    ap.add_argument("--gpus", default="64", help="comma-separated GPU counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lam", type=float, default=60.0,
                    help="generators: mean seconds between arrivals (default 60)")
    ap.add_argument("--round-s", type=float, help="round length (makes a policy round-based)")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per run (default 1800)")
    ap.add_argument("--stream", action="store_true",
                    help="overlay: hand the run its jobs as a stream, each copy made as it is "
                         "submitted (memory stays with the active jobs; CPU s then includes "
                         "making the copies)")
    ap.add_argument("--policy-time", action="store_true",
                    help="also time the policy's own methods (outermost calls, the "
                         "walks and placements they make included) and print their µs per "
                         "event as a last column")
    args = ap.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, source {args.source}, seed {args.seed}"
          f"{', streamed' if args.stream else ''}, "
          f"{'compiled cores (mypyc)' if compiled.active() else 'cores from source'}")
    print(f"{'policy':<22} {'jobs':>9} {'GPUs':>7} {'wall s':>8} {'CPU s':>8} {'events':>10} "
          f"{'µs/event':>9} {'events/s':>9} {'jobs/s':>8} {'RSS MB':>7} {'finished':>9}  digest"
          f"{'  policy µs/event' if args.policy_time else ''}")
    for policy in args.policies.split(","):
        for jobs in (int(x) for x in args.jobs.split(",")):
            for gpus in (int(x) for x in args.gpus.split(",")):
                r = run(args.source, policy, jobs, gpus, args.seed, args.lam, args.round_s,
                        args.timeout_s, args.stream, args.policy_time)
                if "error" in r:
                    print(f"{policy:<22} {jobs:>9} {gpus:>7}  {r['error']}")
                    continue
                wall, cpu, events = float(r["wall_s"]), float(r["cpu_s"]), int(r["events"])
                print(f"{policy:<22} {r['jobs']:>9} {r['gpus']:>7} {wall:>8.1f} {cpu:>8.1f} "
                      f"{events:>10} {cpu / events * 1e6:>9.1f} {events / cpu:>9.0f} "
                      f"{r['jobs'] / cpu:>8.0f} "
                      f"{float(r['peak_rss_mb']):>7.0f} {r['finished']:>9}  "
                      f"{str(r['decision_digest'])[:12]}"
                      f"{_policy_cell(r, events)}", flush=True)


def _policy_cell(row: dict[str, Any], events: int) -> str:
    """The policy's own µs per event, where it was timed."""
    seconds = row.get("policy_s")
    return "" if seconds is None else f" {float(seconds) / events * 1e6:>16.1f}"


if __name__ == "__main__":
    main()
