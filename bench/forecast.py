"""Start-time forecasts: how long one takes, and how far they land from the actual starts.

    .venv/bin/python bench/forecast.py                      # both parts, srtf and tiresias
    .venv/bin/python bench/forecast.py --skip-error         # speed only
    .venv/bin/python bench/forecast.py --trace muri/trace2 --every 600

Speed: a scheduler on 1,000 GPUs (125 nodes of 8) after a cycle at t=0 that left every GPU
busy and exactly `--pending` jobs waiting (jobs from the trace, all submitted at 0); the time
of `forecasting.make`, which copies the scheduler's state (policy fork included) and plays
its cycles forward until the last waiting job starts: wall and CPU seconds, best of
`--repeat` (on a shared machine the CPU time is the steadier figure).

Error: the trace simulated with forecasts every `--every` seconds of cluster time; the
summary's `forecast_error_s` (|forecast − actual start| of every forecast made while a job
waited, and of the first forecast of each wait; services.metrics.forecasts). These runs see
the trace's later arrivals, which no forecast knows of: that is the error measured.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time

from loom.simulate import SimConfig, run_simulation
from schemas.cluster import ClusterSpec
from schemas.events import envelope
from schemas.job import JobSpec, SubmitJob
from services.scheduler import forecasting
from services.scheduler.build import build_scheduler
from services.scheduler.core import SchedulerCore
from services.scheduler.forecast import forecast
from traces import load_cluster, load_trace


def loaded(policy: str, jobs: list[JobSpec], count: int, cluster: ClusterSpec
           ) -> SchedulerCore:
    """A scheduler that admitted the first `count` jobs at t=0 and ran its first cycle."""
    core = build_scheduler(policy, cluster, forecast_every_s=0.0)
    for i, spec in enumerate(itertools.islice(itertools.cycle(jobs), count)):
        spec = spec.model_copy(update={"job_id": f"j{i}", "submit_time_s": 0.0})
        env = envelope(SubmitJob.from_spec(spec), event_id=f"e{i}", occurred_at=0.0,
                       producer="bench", causation_id=None)
        core.handle(env, 0.0)
    core.on_timer("cycle", 0.0)
    return core


def with_pending(policy: str, jobs: list[JobSpec], pending: int, cluster: ClusterSpec
                 ) -> SchedulerCore:
    """`loaded` with as many jobs as leave exactly `pending` waiting (or the nearest above)."""
    count = pending + cluster.total_gpus // 4
    for _ in range(20):
        core = loaded(policy, jobs, count, cluster)
        waiting = core.active - len(core.jobs.running)
        if waiting == pending:
            return core
        count += pending - waiting
    return core


def speed(policy: str, jobs: list[JobSpec], pending: int, repeat: int) -> None:
    cluster = ClusterSpec.uniform(5, 25, 8)  # 1,000 GPUs
    core = with_pending(policy, jobs, pending, cluster)
    waiting = core.active - len(core.jobs.running)
    busy = sum(len(g) for r in core.jobs.running.values() for _, g in r.placement)
    captures, totals, cpus = [], [], []
    made = None
    for _ in range(repeat):
        t, cpu = time.perf_counter(), time.process_time()
        inp = forecasting.capture(core, 0.0)
        captured = time.perf_counter()
        made = forecast(inp)
        totals.append(time.perf_counter() - t)
        cpus.append(time.process_time() - cpu)
        captures.append(captured - t)
    assert made is not None
    started = sum(s is not None for s in made.starts.values())
    print(f"{policy:>9} {cluster.total_gpus:>5} {busy:>5} {len(core.jobs.running):>8} "
          f"{waiting:>8} {started:>8} {made.cycles:>7} {min(captures):>10.3f} "
          f"{min(totals):>8.3f} {min(cpus):>6.3f}", flush=True)


def error(trace: str, cluster: str, policy: str, every: float, overhead: str | None) -> None:
    loaded_trace = load_trace(trace)
    cfg = SimConfig(policy=policy, jobs=list(loaded_trace.source), cluster=load_cluster(cluster),
                    trace_name=trace, overhead=overhead or loaded_trace.default_overhead,
                    forecast_every_s=every)
    t = time.perf_counter()
    result = asyncio.run(run_simulation(cfg))
    wall = time.perf_counter() - t
    e = result.summary["forecast_error_s"]
    assert isinstance(e, dict)

    def fmt(x: object) -> str:
        return "-" if x is None else f"{float(x):,.0f}"  # type: ignore[arg-type]

    digest = str(result.summary["decision_digest"])[:8]
    print(f"{policy:>9} {fmt(e['median']):>12} {fmt(e['p90']):>12} "
          f"{fmt(e['first_median']):>12} {fmt(e['first_p90']):>12} {e['jobs']:>6} "
          f"{e['forecasts']:>9} {e['unforecast']:>5} {digest:>9} {wall:>7.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="srtf,tiresias")
    ap.add_argument("--trace", default="muri/trace3")
    ap.add_argument("--cluster", default="n8g8", help="the error runs' cluster")
    ap.add_argument("--overhead", help="the error runs' overhead model (default: the trace's)")
    ap.add_argument("--pending", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--every", type=float, default=3600.0,
                    help="the error runs forecast at most every S seconds (default 3600)")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-error", action="store_true")
    args = ap.parse_args()
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not args.skip_speed:
        jobs = list(load_trace(args.trace).source)
        print(f"forecast speed: {args.pending:,} waiting jobs, jobs from {args.trace}")
        print(f"{'policy':>9} {'GPUs':>5} {'busy':>5} {'running':>8} {'waiting':>8} "
              f"{'forecast':>8} {'cycles':>7} {'capture s':>10} {'total s':>8} {'cpu s':>6}")
        for name in names:
            speed(name, jobs, args.pending, args.repeat)
    if not args.skip_error:
        print(f"forecast error (seconds): {args.trace} on {args.cluster}, a forecast at most "
              f"every {args.every:g} s")
        print(f"{'policy':>9} {'median':>12} {'p90':>12} {'first med':>12} {'first p90':>12} "
              f"{'jobs':>6} {'forecasts':>9} {'none':>5} {'digest':>9} {'wall s':>7}")
        for name in names:
            error(args.trace, args.cluster, name, args.every, args.overhead)


if __name__ == "__main__":
    main()
