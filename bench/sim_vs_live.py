"""Simulation against a live run: do measured profiles make `loom sim` predict real JCTs?

1. `loom profile` measures the workloads (or `--profile DIR` reuses a profile): throughput at
   1 and 2 processes and the restart overhead of the real trainers.
2. `loom sim --profile` runs a small job mix on a 1-node, 2-GPU cluster under FIFO.
3. The same mix runs live: a real nats-server, the control plane and a node agent with two
   fake GPUs (each a CPU trainer process), real PyTorch trainers; JCT = submit until the
   scheduler's `finished` transition, timed by a client on the bus.

Prints per job the simulated and live JCTs and their difference, and the average over jobs,
for each live repeat (the machine is shared, so live JCTs are noisy: repeat and look at the
spread).

    python bench/sim_vs_live.py                            # profile, simulate, 2 live runs
    python bench/sim_vs_live.py --profile runs/prof --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from rich.console import Console
from rich.table import Table

from loom.profile import ProfileOptions, run_profile
from loom.runs import RunSpec, run_one
from loom.up import UpOptions, up
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import JobTransitionV1
from schemas.job import JobState
from services.runtime.bus import MSG_ID
from services.runtime.nats_live import ensure_stream
from services.runtime.natsserver import free_port

POLICY = "fifo"
BATCH = 32


@dataclass(frozen=True)
class MixJob:
    job_id: str
    model: str  # a workload family (the node agent launches it as is)
    gpus: int
    iterations: int


# FIFO on 2 GPUs: a and b run together, c (2 GPUs) waits for both, d waits for c.
MIX = (
    MixJob("a-cnn", "cnn", 1, 500),
    MixJob("b-lm", "transformer", 1, 80),
    MixJob("c-cnn2", "cnn", 2, 600),
    MixJob("d-lm", "transformer", 1, 60),
)
SUBMIT_GAP_S = 0.01  # jobs are submitted in this order, back to back


def cluster() -> ClusterSpec:
    return ClusterSpec.uniform(1, 1, 2, gpu_type="fake", name="one-node")


def write_trace(path: Path, jobs: Sequence[MixJob]) -> None:
    """The mix as an ElasticFlow-format trace (its speed constant is replaced by the profile)."""
    rows = ["job_id,submit_time,iteration,model_name,ddl,batch_size,num_gpu,duration"]
    rows += [f"{j.job_id},{i * SUBMIT_GAP_S},{j.iterations},{j.model},1000000,{BATCH},{j.gpus},"
             f"{j.iterations}" for i, j in enumerate(jobs)]
    path.write_text("\n".join(rows) + "\n")


def simulate(profile: Path, jobs: Sequence[MixJob], work: Path) -> dict[str, float]:
    trace = work / "mix.csv"
    write_trace(trace, jobs)
    spec_file = work / "cluster.json"
    spec_file.write_text(cluster().model_dump_json())
    result = run_one(RunSpec(trace=str(trace), cluster=str(spec_file), policy=POLICY,
                             measured=str(profile)))
    if result.summary["errors"]:
        raise RuntimeError(f"simulation reported errors: {result.summary}")
    return {j.job_id: j.jct_s for j in result.jobs if j.jct_s is not None}


async def live(jobs: Sequence[MixJob], work: Path, timeout_s: float = 600.0
               ) -> dict[str, float]:
    """JCTs of the mix on a live local cluster (real NATS, node agent, PyTorch trainers)."""
    spec = cluster()
    spec_file = work / "live-cluster.json"
    spec_file.write_text(spec.model_dump_json())
    state = work / f"live-{time.monotonic_ns()}"
    state.mkdir()
    ready, stop = asyncio.Event(), asyncio.Event()
    opts = UpOptions(spec, str(spec_file), policy=POLICY, trainers="pytorch", gpus_per_node=2,
                     state_dir=state, prometheus_port=free_port())
    url: list[str] = []
    task = asyncio.create_task(up(opts, ready=ready, stop=stop, url_out=url))
    try:
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({waiter, task}, timeout=120,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            raise RuntimeError("the local cluster did not come up")
        return await _drive(url[0], jobs, timeout_s)
    finally:
        stop.set()
        await task


async def _drive(url: str, jobs: Sequence[MixJob], timeout_s: float) -> dict[str, float]:
    nc = await nats.connect(url)
    submitted: dict[str, float] = {}
    finished: dict[str, float] = {}
    all_done = asyncio.Event()

    async def on_transition(msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, JobTransitionV1) and body.job_id in submitted \
                and body.state is JobState.FINISHED and body.job_id not in finished:
            finished[body.job_id] = time.monotonic()
            if len(finished) == len(jobs):
                all_done.set()

    await nc.subscribe(subjects.JOB_TRANSITION, cb=on_transition)
    js = nc.jetstream()
    await ensure_stream(js)
    for job in jobs:
        body = {"job_id": job.job_id, "model": job.model, "gpus": job.gpus,
                "iterations": job.iterations, "batch_size": BATCH, "iteration_time_s": 0.05,
                "tenant": "bench"}
        submitted[job.job_id] = time.monotonic()
        await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                         headers={MSG_ID: f"submit.{job.job_id}.{time.time_ns()}"})
    try:
        await asyncio.wait_for(all_done.wait(), timeout_s)
    finally:
        await nc.close()
    return {jid: finished[jid] - submitted[jid] for jid in finished}


def compare_table(sim: dict[str, float], runs: list[dict[str, float]],
                  jobs: Sequence[MixJob]) -> tuple[Table, list[float]]:
    """Per job: simulated JCT, each live JCT, and the relative difference of their mean."""
    table = Table(title=f"sim vs live JCT (s), {POLICY}, 1 node x 2 fake GPUs")
    for col in ("job", "model", "GPUs", "iterations", "sim", "live (each run)", "live mean",
                "diff"):
        table.add_column(col)
    diffs = []
    for j in jobs:
        lives = [r[j.job_id] for r in runs]
        mean = statistics.fmean(lives)
        diff = (sim[j.job_id] - mean) / mean
        diffs.append(diff)
        table.add_row(j.job_id, j.model, str(j.gpus), str(j.iterations), f"{sim[j.job_id]:.1f}",
                      ", ".join(f"{x:.1f}" for x in lives), f"{mean:.1f}", f"{diff:+.0%}")
    sim_avg = statistics.fmean(sim[j.job_id] for j in jobs)
    live_avgs = [statistics.fmean(r[j.job_id] for j in jobs) for r in runs]
    live_avg = statistics.fmean(live_avgs)
    avg_diff = (sim_avg - live_avg) / live_avg
    table.add_row("average", "", "", "", f"{sim_avg:.1f}", ", ".join(f"{x:.1f}" for x in live_avgs),
                  f"{live_avg:.1f}", f"{avg_diff:+.0%}")
    return table, [*diffs, avg_diff]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, help="a `loom profile` folder (default: measure now)")
    p.add_argument("--repeats", type=int, default=2, help="live runs (default 2)")
    p.add_argument("--profile-repeats", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0, help="profile seconds per point")
    p.add_argument("--out", type=Path, help="write sim_vs_live.json here")
    args = p.parse_args(argv)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="loom-sim-vs-live-") as tmp:
        work = Path(tmp)
        profile = args.profile
        if profile is None:
            profile = work / "profile"
            t0 = time.perf_counter()
            run_profile(ProfileOptions(models=("cnn", "transformer"), out=profile,
                                       seconds=args.seconds, repeats=args.profile_repeats),
                        lambda line: console.print(line, highlight=False))
            console.print(f"profile took {time.perf_counter() - t0:.0f} s")
        sim = simulate(profile, MIX, work)
        runs = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            runs.append(asyncio.run(live(MIX, work)))
            console.print(f"live run {i + 1}: {time.perf_counter() - t0:.0f} s wall")
        table, diffs = compare_table(sim, runs, MIX)
        console.print(table)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "sim_vs_live.json").write_text(json.dumps(
                {"sim": sim, "live": runs, "diffs": diffs,
                 "profile": json.loads((profile / "profile.json").read_text())}, indent=2))
        worst = max(abs(d) for d in diffs)
        console.print(f"largest |diff| {worst:.0%} (target 20%)")
        return 0 if worst <= 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
