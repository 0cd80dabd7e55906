"""ElasticFlow speed: the ten ITP clusters of Fig. 8b, and one admission decision.

`--sweep` runs `elasticflow` on every ITP cluster trace on the cluster the artifact's
`run_fig8b.sh` gives it (A100, `--overhead elasticflow`, 60 s slots), `--workers` at a time,
each in a fresh process, and prints per cluster the deadline ratio beside the paper's bar,
the wall and CPU time, and the sweep's wall time. `--admission` times one admission decision
(the arrival planned with every admitted job, then the leftover allocation) with 1,000 jobs
admitted on n16g8.

    .venv/bin/python bench/elasticflow_speed.py --sweep --workers 2
    .venv/bin/python bench/elasticflow_speed.py --admission
    .venv/bin/python bench/elasticflow_speed.py --artifact DIR/ElasticFlow/scheduler \
        --artifact-python /path/to/venv/bin/python

`--artifact` runs the artifact's own simulator (pkusys/ElasticFlow, `scheduler.py
--simulation=True --schedule=ef-accessctrl`, its dependencies in the interpreter given) and
then Loom on the same 1,000-job generated trace (λ = 1500 s, seed 0; n16g8, A100, 240 s
slots) and prints both ratios, wall times and the speed-up, and how Loom's cycle kernel was
compiled (`policies.elasticflow.aot`). Loom runs with `--no-plot` (the artifact writes logs
and no figure) once before the artifact and once after, so that a drift in the machine's
speed shows, then as `loom sim` runs by default (drawing jct_cdf.png too).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.policies.driver

# Fig. 8b: ITP cluster → (cluster spec of run_fig8b.sh, the paper's ElasticFlow bar).
CLUSTERS = {
    1: ("n64g8", .788), 2: ("n64g8", .822), 3: ("n64g8", .455), 4: ("n128g8", .631),
    5: ("n64g8", .832), 6: ("n64g8", .607), 7: ("n128g8", .665), 8: ("n128g8", .896),
    9: ("n128g8", .938), 10: ("n32g8", .981),
}

CHILD = """
import json, resource, sys, tempfile
from loom.cli import main
trace, cluster = sys.argv[1:3]
with tempfile.TemporaryDirectory() as out:
    code = main(["sim", "--trace", trace, "--cluster", cluster, "--gpu-type", "A100",
                 "--overhead", "elasticflow", "--round-s", "60", "--policy", "elasticflow",
                 "--out", out])
    summary = json.load(open(out + "/summary.json"))
cpu = resource.getrusage(resource.RUSAGE_SELF)
summary["cpu_s"] = cpu.ru_utime + cpu.ru_stime
print(json.dumps(summary))
sys.exit(code)
"""


def run_cluster(n: int) -> tuple[int, dict[str, object], float]:
    cluster, _ = CLUSTERS[n]
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", CHILD, f"itp/cluster{n:02d}",
                          f"elasticflow/{cluster}"], check=True, capture_output=True,
                         text=True).stdout
    return n, json.loads(out.strip().splitlines()[-1]), time.monotonic() - t0


def sweep(workers: int, which: list[int]) -> None:
    print(f"{'ITP':>4} {'cluster':<8} {'jobs':>7} {'paper':>6} {'Loom':>7} {'met':>7} "
          f"{'declined':>8} {'wall s':>8} {'CPU s':>7}", flush=True)
    t0 = time.monotonic()
    # Largest first, so the slowest runs do not start last.
    order = sorted(which, key=lambda n: -CLUSTERS[n][0].count("128"))
    with ThreadPoolExecutor(workers) as pool:
        for n, s, wall in pool.map(run_cluster, order):
            cluster, paper = CLUSTERS[n]
            print(f"{n:>4} {cluster:<8} {s['jobs']:>7,} {paper:>6.3f} "
                  f"{float(s['deadline_ratio']):>7.4f} {s['deadline_met']:>7,} "  # type: ignore[arg-type]
                  f"{s['declined']:>8,} {wall:>8.1f} {float(s['cpu_s']):>7.1f}",  # type: ignore[arg-type]
                  flush=True)
    print(f"sweep: {len(which)} clusters, {workers} at a time, {time.monotonic() - t0:.1f} s "
          "wall")


def admission(admitted: int, repeat: int = 5) -> None:
    """Time the policy's cycle when one job arrives and `admitted` jobs are admitted.

    Jobs from ElasticFlow's generator (λ = 1500 s, seed 0, A100 tables), all present at t = 0
    with deadlines loose enough for every one to be admitted (7-67 days, spread by job),
    on n16g8 with 240 s slots: the first cycle admits them all, each timed cycle admits one
    more arrival, planning it with all the others (the admission decision) and handing out
    the spare GPUs. The compiled kernel is warmed up by the first cycle."""
    import statistics
    import tempfile

    import policies
    from loom.cli import main as loom
    from policies.elasticflow import ElasticFlow, Need, planner_for
    from tests.policies.driver import Driver
    from traces import load_cluster, load_trace
    from traces.scaling import load_scaling, with_scaling

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/ef.csv"
        loom(["gen-trace", "elasticflow", "--jobs", str(admitted + repeat), "--lam", "1500",
              "--seed", "0", "--out", path])
        jobs = with_scaling(load_trace(path).jobs, load_scaling("A100"))
    day = 86_400.0
    jobs = tuple(j.model_copy(update={"submit_time_s": 0.0, "best_effort": False,
                                      "deadline_s": day * (7 + 60 * i / len(jobs))})
                 for i, j in enumerate(jobs))
    policy = policies.make("elasticflow")
    policy.configure(seed=0, round_s=240.0)
    assert isinstance(policy, ElasticFlow)
    speeds: dict[str, Mapping[int, float]] = {}
    driver = Driver(policy, load_cluster("elasticflow/n16g8"))
    driver.add(*jobs[:admitted])
    t0 = time.perf_counter()
    driver.cycle(0.0)
    first = time.perf_counter() - t0
    accepted = getattr(policy, "accepted", 0)
    decisions, cycles = [], []
    total = driver.cluster.total_gpus
    now = 0.0  # the clock stands still, so no admitted job finishes in between
    # Before timing: load plan_all's compiled code (the policy runs the fused `plan_cycle`),
    # and fill `speeds` with every job's table, as the policy keeps its own between cycles.
    first_needs = [Need.of(r.view(), speeds) for r in driver.jobs.values()][:1]
    planner_for(first_needs).plan_all(first_needs, now, total, 240.0)
    for k in range(repeat):
        driver.add(jobs[admitted + k])
        # The decision alone: every active job's need, in deadline order, planned at its
        # minimum satisfactory share (the arrival is admitted if every plan meets its
        # deadline), as the policy's cycle does first.
        # Python's cyclic collector paused, as `timeit` does: a full collection over the
        # thousands of objects a 1,000-job run keeps can add tens of milliseconds to any step.
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        needs = sorted((Need.of(r.view(), speeds) for r in driver.jobs.values()),
                       key=lambda n: n.deadline)
        ok, _, _ = planner_for(needs).plan_all(needs, now, total, 240.0)
        decisions.append(time.perf_counter() - t0)
        gc.enable()
        t0 = time.perf_counter()
        driver.cycle(now)  # the whole cycle: the decision, spare GPUs, placement
        cycles.append(time.perf_counter() - t0)
        assert ok
    ms = 1000.0
    print(f"admission: {accepted} of {admitted} admitted in the first cycle ({first:.2f} s, "
          f"kernel load included); then {repeat} arrivals, "
          f"{getattr(policy, 'accepted', 0) - accepted} admitted, each among "
          f"{admitted:,}-{admitted + repeat - 1:,} others:")
    print(f"  admission decision  median {statistics.median(decisions) * ms:6.1f} ms, "
          f"max {max(decisions) * ms:6.1f} ms")
    print(f"  whole cycle         median {statistics.median(cycles) * ms:6.1f} ms, "
          f"max {max(cycles) * ms:6.1f} ms (with spare GPUs by marginal return, placement)")


def versus_artifact(scheduler_dir: Path, python: str, jobs: int) -> None:
    import tempfile

    def timed(cmd: list[str], cwd: Path | None = None) -> float:
        t0 = time.monotonic()
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
        return time.monotonic() - t0

    with tempfile.TemporaryDirectory() as tmp:
        trace, logs, out = Path(tmp, "trace.csv"), Path(tmp, "logs"), Path(tmp, "loom")
        subprocess.run([sys.executable, "-m", "loom.cli", "gen-trace", "elasticflow", "--jobs",
                        str(jobs), "--lam", "1500", "--seed", "0", "--out", str(trace)],
                       check=True, capture_output=True)
        logs.mkdir()
        loom = [sys.executable, "-m", "loom.cli", "sim", "--trace", str(trace), "--cluster",
                "elasticflow/n16g8", "--gpu-type", "A100", "--round-s", "240", "--overhead",
                "elasticflow", "--policy", "elasticflow", "--out", str(out)]
        # Loom runs before and after the artifact, so a machine whose speed drifts shows it;
        # like for like is --no-plot (the artifact writes logs and draws nothing).
        before = timed([*loom, "--no-plot"])
        artifact_s = timed([python, "scheduler.py", "--cluster_spec=cluster_specs/n16g8.csv",
                            "--print", "--scheme=elastic", f"--trace_file={trace}",
                            "--schedule=ef-accessctrl", f"--log_path={logs}",
                            "--simulation=True", "--scheduling_slot=240", "--gpu_type=A100"],
                           cwd=scheduler_dir)
        after = timed([*loom, "--no-plot"])
        plotted = timed(loom)
        row = (logs / "final_result.csv").read_text().splitlines()[1].split(",")
        summary = json.loads((out / "summary.json").read_text())
    loom_s = (before + after) / 2
    from policies.elasticflow import aot

    kernel = ("compiled ahead of time" if aot.built_path().exists() else
              "numba's JIT (scripts/setup did not build it ahead of time)")
    print(f"{jobs:,}-job generated trace, n16g8, A100, 240 s slots (process wall, start-up "
          f"included; Loom's cycle kernel {kernel}):")
    print(f"  artifact ef-accessctrl  ratio {float(row[1]):.4f}  {artifact_s:7.1f} s")
    print(f"  Loom elasticflow        ratio {summary['deadline_ratio']:.4f}  {before:7.1f} s "
          f"before, {after:.1f} s after ({summary['deadline_met']} met, "
          f"{summary['declined']} declined; --no-plot)")
    print(f"  speed-up {artifact_s / loom_s:.1f}x (against the mean of the two; "
          f"{artifact_s / max(before, after):.1f}-{artifact_s / min(before, after):.1f}x)")
    print(f"  with the JCT plot drawn too: {plotted:.1f} s, {artifact_s / plotted:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--clusters", default="1,2,3,4,5,6,7,8,9,10")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--admission", action="store_true")
    ap.add_argument("--artifact", type=Path, help="the artifact's ElasticFlow/scheduler folder")
    ap.add_argument("--artifact-python", default=sys.executable,
                    help="an interpreter with the artifact's dependencies")
    ap.add_argument("--jobs", type=int, default=1000, help="--artifact: trace size")
    args = ap.parse_args()
    print(f"# {platform.node()} · {platform.processor() or platform.machine()} · "
          f"Python {platform.python_version()} · {os.cpu_count()} CPUs")
    if args.sweep:
        sweep(args.workers, [int(c) for c in args.clusters.split(",")])
    if args.admission:
        admission(1000)
    if args.artifact is not None:
        versus_artifact(args.artifact, args.artifact_python, args.jobs)


if __name__ == "__main__":
    main()
