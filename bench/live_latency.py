"""Submit → placed latency of the live control plane over NATS on loopback.

    .venv/bin/python bench/live_latency.py [--nodes 100] [--gpus-per-node 8] [--jobs 500]

Starts a private nats-server, the scheduler, placer and metrics (one process each, as
`loom serve` runs them) and N node agents (simulated trainers; each with its own NATS
connection and durable consumers, `--agent-processes` processes hosting them to spare memory),
then submits jobs one at a time, as `loom submit` does, and times each from the submit's
publish to the scheduler's RUNNING transition on `loom.jobs.transition` (observed by a plain
subscriber).
Jobs are short and small enough to start at once: this measures the control path, not queueing.
Prints p50/p90/p99/max in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

from loom.serve import ServeOptions, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import JobTransitionV1
from schemas.job import JobState
from services.runtime.bus import MSG_ID
from services.runtime.logging import configure
from services.runtime.nats_live import ensure_stream
from services.runtime.natsserver import EmbeddedNats


async def main(args: argparse.Namespace) -> None:
    configure("warning")
    if args.agents is not None:  # a child hosting some of the node agents
        return await host_agents(args)
    server = await EmbeddedNats.start()
    spec = Path(tempfile.mkdtemp(prefix="loom-bench-")) / "cluster.json"
    spec.write_text(ClusterSpec.uniform(1, args.nodes, args.gpus_per_node,
                                        gpu_type="fake").model_dump_json())
    base = ["--nats-url", server.url, "--cluster", str(spec), "--log-level", "warning"]
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-m", "loom.cli", "serve",
                                                  svc, *base)
             for svc in ("scheduler", "placer", "metrics")]
    per = -(-args.nodes // args.agent_processes)
    procs += [await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--agents", f"{i}:{min(i + per, args.nodes)}",
        "--nats-url", server.url, "--cluster-file", str(spec))
        for i in range(0, args.nodes, per)]
    t_up = time.perf_counter()
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await ensure_stream(js)
    placed: dict[str, float] = {}
    waiter: dict[str, asyncio.Future[None]] = {}

    sent: dict[str, float] = {}
    steps: dict[str, list[tuple[float, str]]] = {}

    async def on_any(msg: Any) -> None:
        if msg.subject == subjects.JOB_SUBMIT:
            return
        body = decode(msg.data).body
        ids = [getattr(body, "job_id", None)] + [x.job_id for x in
                                                  getattr(body, "launches", ())]
        for jid in ids:
            if jid in sent:
                name = type(body).__name__ + (f"({body.state.value})"
                                              if isinstance(body, JobTransitionV1) else "")
                steps.setdefault(jid, []).append((time.perf_counter(), name))

    if args.trace_steps:
        await nc.subscribe(subjects.EVERY_SUBJECT, cb=on_any)

    async def on_transition(msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, JobTransitionV1) and body.state is JobState.RUNNING:
            placed.setdefault(body.job_id, time.perf_counter())
            fut = waiter.get(body.job_id)
            if fut is not None and not fut.done():
                fut.set_result(None)

    await nc.subscribe(subjects.JOB_TRANSITION, cb=on_transition)
    while len(await ping(nc)) < 3 + args.nodes:
        await asyncio.sleep(0.5)
    services = await ping(nc)
    print(f"{len(services)} services up in {time.perf_counter() - t_up:.1f} s "
          f"({args.nodes} node agents × {args.gpus_per_node} GPUs)")
    latencies = []
    for i in range(args.jobs + args.warmup):
        jid = f"bench-{i}"
        waiter[jid] = asyncio.get_running_loop().create_future()
        body = {"job_id": jid, "model": "resnet18", "gpus": 1 + i % args.gpus_per_node,
                "iterations": 1, "iteration_time_s": 0.001}
        t0 = sent[jid] = time.perf_counter()
        await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                         headers={MSG_ID: f"submit.{jid}"})
        await asyncio.wait_for(waiter[jid], 30)
        if i >= args.warmup:
            latencies.append((placed[jid] - t0) * 1000)
    latencies.sort()
    if args.trace_steps:
        for jid in [f"bench-{i}" for i in range(args.warmup, args.warmup + 5)]:
            t0 = sent[jid]
            print(jid, ", ".join(f"{name}@{1000 * (t - t0):.1f}" for t, name in steps[jid]))

    def q(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    print(f"submit → placed over {len(latencies)} jobs: p50 {q(0.5):.1f} ms, "
          f"p90 {q(0.9):.1f} ms, p99 {q(0.99):.1f} ms, max {latencies[-1]:.1f} ms, "
          f"mean {statistics.mean(latencies):.1f} ms")
    await nc.close()
    for proc in procs:
        proc.terminate()
    for proc in procs:
        await proc.wait()
    await server.stop()


async def host_agents(args: argparse.Namespace) -> None:
    """Node agents `args.agents` (a range i:j of the cluster's nodes), until SIGTERM."""
    cluster = ClusterSpec.model_validate_json(Path(args.cluster_file).read_text())
    lo, hi = (int(x) for x in args.agents.split(":"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await asyncio.gather(*(serve(ServeOptions("nodeagent", args.nats_url, cluster,
                                              node=n.node_id, trainers="simulated"), stop)
                           for n in cluster.nodes[lo:hi]))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--agent-processes", type=int, default=4)
    p.add_argument("--trace-steps", action="store_true",
                   help="also print when each step of five jobs was seen on the bus")
    p.add_argument("--agents", help=argparse.SUPPRESS)  # child: host these node agents
    p.add_argument("--nats-url", help=argparse.SUPPRESS)
    p.add_argument("--cluster-file", help=argparse.SUPPRESS)
    asyncio.run(main(p.parse_args()))
