"""Queues: three queues in one cohort on a bundled trace, each policy with and without the layer.

The bundled traces have no user column, so the bench deals the trace's jobs to three queues
itself, deterministically: the i-th job in submission order goes to queue `QUEUES[i % 3]`
(its tenant is the queue's name, one tenant per queue). The queues share one cohort; their
nominal quotas split the cluster by `--split` (2:1:1 by default: 32/16/16 GPUs on n8g8), with
no borrowing or lending limit and `reclaim = "any"` (docs/queues.md). Each policy runs twice:
without a tenants file (the trace as it is: its digest is the one docs/queues.md quotes) and
with the queues. Printed per run: avg JCT, preemptions, those by reclaim and the GPU-hours they
lost (`reclaims`, `reclaim_lost_gpu_h`), the recovery measure below, the decision digest and
wall time; written to --out: `results.json`, `queues.toml` (the tenants file) and
`shares.png` (GPUs held per queue over time, stacked, with the nominal quotas).

Recovery (issue 22: "each queue's waiting jobs get their nominal GPUs back within one
checkpoint grace period plus one round"): a queue is *owed* while it holds fewer GPUs than its
nominal quota and one of its waiting jobs would fit in the difference. Every stretch of time a
queue is owed is an episode; its length is the longest any moment in it waited for the queue to
hold its nominal quota (or all its waiting demand that fits in it). The bound is one round: 0
when the policy re-plans on events, its round or slot otherwise. Simulated stops are
instantaneous, so the checkpoint grace period (the node agent's `grace_s` on a live cluster)
is 0 here. Holdings come from the run's event log (`loom.jobs.transition` records), not from
hooks in the scheduler. Measured without the layer too, for contrast: nothing takes GPUs back.

    .venv/bin/python bench/queues.py                          # muri/trace3 on n8g8, 4 policies
    .venv/bin/python bench/queues.py --policies srtf --round-s 360 --out /tmp/q
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loom.eventlog import read_log
from loom.simulate import SimConfig, SimResult, run_simulation
from schemas import subjects
from schemas.codec import decode
from schemas.job import JobSpec, JobState
from schemas.tenants import TenantsConfig, parse_tenants
from services.scheduler.build import build_scheduler
from traces import load_cluster, load_trace

QUEUES = ("a", "b", "c")
COHORT = "research"
POLICIES = "tiresias,srtf,themis,elasticflow"
# Holdings over time, per queue: (time, GPUs held from then on), one point per change.
Series = list[tuple[float, int]]


@dataclass(frozen=True, slots=True)
class Change:
    """One job's lifecycle transition, as the event log has it."""

    at: float
    job_id: str
    state: JobState
    gpus: int  # GPUs held from now on (0 unless running)


@dataclass(frozen=True, slots=True)
class Episode:
    """A stretch of time a queue was owed GPUs (see the module docstring)."""

    queue: str
    start: float
    end: float
    closed: bool  # False: still owed when the log ended
    # GPUs of the cluster that no job held as it began, and GPUs its queue's smallest waiting
    # job that fits asks for: with idle >= need, placement (a gang that finds no node) or
    # the policy, not quota, kept the job waiting.
    idle: int = 0
    need: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


# -- the tenants file --------------------------------------------------------------------------
def split_nominal(total: int, ratio: Sequence[int]) -> dict[str, int]:
    """The cluster's GPUs split over the queues by `ratio`, rounding down; what rounding
    leaves goes to the first queue, so the quotas add up to the cluster (a queue below its
    nominal quota then always has lent GPUs to take back)."""
    if len(ratio) != len(QUEUES) or any(r <= 0 for r in ratio):
        raise ValueError(f"--split needs {len(QUEUES)} positive parts, got {list(ratio)}")
    parts = {q: total * r // sum(ratio) for q, r in zip(QUEUES, ratio, strict=True)}
    parts[QUEUES[0]] += total - sum(parts.values())
    return parts


def queue_file(nominal: Mapping[str, int]) -> dict[str, Any]:
    """The tenants file (as parsed data): one cohort, a queue per tenant of the same name."""
    return {"cohorts": {COHORT: {}},
            "queues": {q: {"cohort": COHORT, "tenants": [q], "nominal": n, "reclaim": "any"}
                       for q, n in nominal.items()}}


def to_toml(data: Mapping[str, Any]) -> str:
    lines = ["# bench/queues.py: jobs dealt to the queues by submission order (i % 3)"]
    for table, entries in data.items():
        for name, fields in entries.items():
            lines.append(f"\n[{table}.{name}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def dealt(jobs: Sequence[JobSpec]) -> list[JobSpec]:
    """The trace's jobs with their queue's name as tenant, i-th job to `QUEUES[i % 3]`."""
    return [j.model_copy(update={"tenant": QUEUES[i % len(QUEUES)]}) for i, j in enumerate(jobs)]


# -- from the event log ------------------------------------------------------------------------
def read_changes(path: Path) -> list[Change]:
    """Every job transition of a run's event log, in delivery order."""
    out = []
    for rec in read_log(path).records:
        if rec.subject != subjects.JOB_TRANSITION:
            continue
        body = decode(rec.data).body
        out.append(Change(rec.time, body.job_id, body.state, body.gpus))  # type: ignore[attr-defined]
    return out


State = tuple[dict[str, int], dict[str, Counter[int]]]  # per queue: GPUs held, waiting sizes


def replay(changes: Iterable[Change], queue_of: Mapping[str, str],
           size_of: Mapping[str, int]) -> Iterator[tuple[float, State]]:
    """Each queue's GPUs held and its waiting jobs' sizes after every instant with a change
    (all changes at one time applied together: a reclaim and the lender's start are one
    instant). The state yielded is live: copy what is kept. Jobs in no queue are skipped."""
    held = dict.fromkeys(sorted(set(queue_of.values())), 0)
    waiting: dict[str, Counter[int]] = {q: Counter() for q in held}
    now: dict[str, tuple[JobState, int]] = {}  # job → its state and GPUs
    at: float | None = None
    for c in changes:
        q = queue_of.get(c.job_id)
        if q is None:
            continue
        if at is not None and c.at != at:
            yield at, (held, waiting)
        at = c.at
        before = now.pop(c.job_id, None)
        if before is not None:
            state, gpus = before
            if state is JobState.RUNNING:
                held[q] -= gpus
            elif state.waiting:
                waiting[q][size_of[c.job_id]] -= 1
        if c.state is JobState.RUNNING:
            held[q] += c.gpus
        elif c.state.waiting:
            waiting[q][size_of[c.job_id]] += 1
        if not c.state.terminal:
            now[c.job_id] = (c.state, c.gpus)
    if at is not None:
        yield at, (held, waiting)


def owed(held: int, waiting: Counter[int], nominal: int) -> int:
    """GPUs of the smallest waiting job of a queue holding `held` that fits in its idle
    nominal quota (the layer's claim: docs/queues.md, "Reclaim and its victims"); 0: none,
    the queue is owed nothing."""
    room = nominal - held
    return min((size for size, n in waiting.items() if n > 0 and size <= room), default=0)


def measure(changes: Iterable[Change], queue_of: Mapping[str, str], size_of: Mapping[str, int],
            nominal: Mapping[str, int], capacity: int
            ) -> tuple[dict[str, Series], list[Episode]]:
    """Per queue, GPUs held over time (a point where it changes), and the episodes in which
    it was owed GPUs, in order of their start. `capacity`: the cluster's GPUs."""
    series: dict[str, Series] = {q: [] for q in nominal}
    open_: dict[str, tuple[float, int, int]] = {}  # queue → its episode's start, idle, need
    episodes: list[Episode] = []
    last = 0.0
    for at, (held, waiting) in replay(changes, queue_of, size_of):
        last = at
        idle = capacity - sum(held.values())
        for q in nominal:
            points = series[q]
            if not points or points[-1][1] != held[q]:
                points.append((at, held[q]))
            need = owed(held[q], waiting[q], nominal[q])
            if need and q not in open_:
                open_[q] = (at, idle, need)
            elif not need and q in open_:
                start, was_idle, was_need = open_.pop(q)
                episodes.append(Episode(q, start, at, True, was_idle, was_need))
    episodes += [Episode(q, start, last, False, idle, need)
                 for q, (start, idle, need) in open_.items()]
    episodes.sort(key=lambda e: (e.start, e.queue))
    return series, episodes


def nearest_rank(values: Sequence[float], pct: float) -> float:
    """The pct-th percentile by nearest rank (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def recovery(episodes: Sequence[Episode], bound_s: float) -> dict[str, Any]:
    durations = [e.duration for e in episodes]
    worst = max(episodes, key=lambda e: e.duration, default=None)
    return {
        "episodes": len(episodes),
        "max_s": max(durations, default=0.0),
        "p99_s": nearest_rank(durations, 99),
        "owed_s": sum(durations),  # queue-seconds owed, all queues
        "over_bound": sum(d > bound_s + 1e-6 for d in durations),
        # of those, how many began with the GPUs idle (placement or the policy, not quota)
        "over_bound_idle": sum(e.duration > bound_s + 1e-6 and e.idle >= e.need
                               for e in episodes),
        "open": sum(not e.closed for e in episodes),
        "bound_s": bound_s,
        "worst": None if worst is None else asdict(worst),
    }


def round_bound(policy: str, cluster: Any, round_s: float | None) -> float:
    """One round of the policy's re-planning as `loom sim` configures it: 0 when it re-plans
    on events (a claim is served in the cycle of its event), else its round or slot."""
    config = build_scheduler(policy, cluster, round_s=round_s).config
    return 0.0 if config.replan == "event" else config.round_s


# -- the plot ----------------------------------------------------------------------------------
def plot_shares(grid: Mapping[str, Mapping[str, Mapping[str, Series]]],
                nominal: Mapping[str, int], end_s: float, path: Path, title: str) -> Path:
    """GPUs held per queue over time, stacked in queue order, one panel per policy (rows) and
    layer (columns); dashed lines at the queues' nominal quotas stacked the same way, so a
    queue's band reaching its line means it holds its nominal quota."""
    from matplotlib.figure import Figure

    rows = list(grid)
    cols = list(dict.fromkeys(m for modes in grid.values() for m in modes))
    fig = Figure(figsize=(6.5 * len(cols), 2.4 * len(rows) + 0.8), dpi=110)
    axes = fig.subplots(len(rows), len(cols), squeeze=False, sharex=True, sharey=True)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    total = sum(nominal.values())
    for i, policy in enumerate(rows):
        for j, mode in enumerate(cols):
            ax = axes[i][j]
            series = grid[policy].get(mode, {})
            times = sorted({t for s in series.values() for t, _ in s} | {0.0, end_s})
            days = [t / 86400 for t in times]
            base = [0.0] * len(times)
            line = 0
            for k, q in enumerate(nominal):
                held = _steps(series.get(q, []), times)
                top = [b + h for b, h in zip(base, held, strict=True)]
                colour = colours[k % len(colours)]
                ax.fill_between(days, base, top, step="post", color=colour, alpha=0.55,
                                linewidth=0, label=f"queue {q} (nominal {nominal[q]})")
                line += nominal[q]
                ax.axhline(line, color=colour, linestyle="--", linewidth=0.9)
                base = top
            ax.set_ylim(0, total * 1.05)
            ax.set_xlim(0, end_s / 86400)
            ax.set_title(f"{policy}, {mode}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel("GPUs held")
            if i == len(rows) - 1:
                ax.set_xlabel("time (days)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))  # room for the legend below
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _steps(points: Series, times: Sequence[float]) -> list[float]:
    """A step series' value at each of `times` (ascending): 0 before its first point."""
    out, k, value = [], 0, 0.0
    for t in times:
        while k < len(points) and points[k][0] <= t:
            value = float(points[k][1])
            k += 1
        out.append(value)
    return out


# -- the runs ----------------------------------------------------------------------------------
def simulate(policy: str, jobs: list[JobSpec], cluster: Any, trace: Any,
             tenants: TenantsConfig | None, round_s: float | None,
             log: Path) -> tuple[SimResult, float, float]:
    """One run with its event log written to `log`; its result, wall and CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = asyncio.run(run_simulation(SimConfig(
        policy=policy, jobs=jobs, cluster=cluster, trace_name=trace.name,
        overhead=trace.default_overhead, tenants=tenants, round_s=round_s, log=log)))
    return result, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="muri/trace3")
    ap.add_argument("--cluster", default="n8g8")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--split", default="2:1:1",
                    help="nominal quotas of queues a:b:c, as parts of the cluster")
    ap.add_argument("--round-s", type=float, default=None,
                    help="re-plan every S seconds (as `loom sim --round-s`)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-queues"))
    ap.add_argument("--keep-logs", action="store_true", help="keep the event logs in --out")
    args = ap.parse_args()

    trace = load_trace(args.trace)
    cluster = load_cluster(args.cluster)
    nominal = split_nominal(cluster.total_gpus, [int(x) for x in args.split.split(":")])
    data = queue_file(nominal)
    tenants = parse_tenants(data, "queues.toml")
    jobs = list(trace.jobs)
    queued = dealt(jobs)
    queue_of = {j.job_id: j.tenant for j in queued}
    size_of = {j.job_id: j.gpus for j in jobs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "queues.toml").write_text(to_toml(data))
    print(f"{args.trace} on {args.cluster} ({cluster.total_gpus} GPUs): {len(jobs)} jobs dealt "
          f"to queues {', '.join(f'{q} (nominal {n})' for q, n in nominal.items())} in cohort "
          f"{COHORT!r}, reclaim any; checkpoint grace 0 (simulated stops are instantaneous)")
    header = (f"{'policy':12}{'queues':>8}{'avg JCT s':>12}{'Δ JCT':>8}{'preempt':>9}"
              f"{'reclaim':>9}{'lost GPU-h':>11}{'owed':>6}{'max s':>10}{'p99 s':>10}"
              f"{'bound s':>8}{'over':>6}{'idle':>5}  {'digest':8}{'wall s':>8}{'cpu s':>7}")
    print(header)
    results: dict[str, Any] = {"trace": args.trace, "cluster": args.cluster,
                               "nominal": nominal, "round_s": args.round_s, "runs": {}}
    grid: dict[str, dict[str, dict[str, Series]]] = {}
    end_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.out if args.keep_logs else Path(tmp)
        for policy in args.policies.split(","):
            bound = round_bound(policy, cluster, args.round_s)
            base_jct = None
            for mode, run_jobs, config in (("without", jobs, None), ("with", queued, tenants)):
                log = logs / f"{policy}-{mode}.log"
                result, wall, cpu = simulate(policy, run_jobs, cluster, trace, config,
                                             args.round_s, log)
                series, episodes = measure(read_changes(log), queue_of, size_of, nominal,
                                           cluster.total_gpus)
                grid.setdefault(policy, {})[f"{mode} queues"] = series
                s = result.summary
                end_s = max(end_s, float(s["makespan_s"] or 0.0))  # type: ignore[arg-type]
                rec = recovery(episodes, bound)
                jct = float(s["avg_jct_s"] or 0.0)  # type: ignore[arg-type]
                base_jct = jct if base_jct is None else base_jct
                delta = f"{100 * (jct / base_jct - 1):+.1f}%" if base_jct else "-"
                print(f"{policy:12}{mode:>8}{jct:>12,.0f}{delta:>8}{s['preemptions']:>9}"
                      f"{s['reclaims']:>9}{float(s['reclaim_lost_gpu_h']):>11,.1f}"  # type: ignore[arg-type]
                      f"{rec['episodes']:>6}{rec['max_s']:>10,.0f}{rec['p99_s']:>10,.0f}"
                      f"{bound:>8g}{rec['over_bound']:>6}{rec['over_bound_idle']:>5}  "
                      f"{str(s['decision_digest'])[:8]:8}"
                      f"{wall:>8.1f}{cpu:>7.1f}")
                keep = ("avg_jct_s", "p99_jct_s", "makespan_s", "finished", "rejected",
                        "preemptions", "reclaims", "reclaim_lost_gpu_h", "gpu_util", "replan",
                        "decision_digest", "cycles", "errors")
                results["runs"][f"{policy}/{mode}"] = {
                    **{k: s[k] for k in keep}, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                    "recovery": rec}
    plot = plot_shares(grid, nominal, end_s, args.out / "shares.png",
                       f"{args.trace} on {args.cluster}: GPUs held per queue (stacked; dashed: "
                       "nominal quotas, stacked)")
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"owed: episodes in which a queue held less than its nominal quota while a job of it "
          f"that fits waited; max, p99 (nearest rank) of their lengths; over: longer than the "
          f"bound (one round); idle: of those, begun with enough GPUs idle for the job "
          f"(placement or the policy kept it waiting, not quota)\nwrote {plot}, "
          f"{args.out / 'results.json'}, {args.out / 'queues.toml'}")


if __name__ == "__main__":
    main()
