"""Submit → placed latency of the live control plane over NATS on loopback.

    .venv/bin/python bench/live_latency.py [--nodes 100] [--gpus-per-node 8] [--jobs 500]

Starts a private nats-server, the scheduler, placer and metrics, and N node agents (simulated
trainers; each with its own NATS connection, all in this process to spare memory), then
submits jobs one at a time, as `loom submit` does, and times each from the submit's publish to
the scheduler's RUNNING transition on `loom.jobs.transition` (observed by a plain subscriber).
Jobs are short and small enough to start at once: this measures the control path, not queueing.
Prints p50/p90/p99/max in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import nats

from loom.serve import ServeOptions, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import JobTransition
from schemas.job import JobState
from services.runtime.logging import configure
from services.runtime.nats_live import MSG_ID, ensure_stream
from services.runtime.natsserver import EmbeddedNats


async def main(args: argparse.Namespace) -> None:
    configure("warning")
    server = await EmbeddedNats.start()
    cluster = ClusterSpec.uniform(1, args.nodes, args.gpus_per_node, gpu_type="fake")
    stop = asyncio.Event()
    base = dict(nats_url=server.url, cluster=cluster, trainers="simulated")
    services = [ServeOptions("scheduler", **base), ServeOptions("placer", **base),  # type: ignore[arg-type]
                ServeOptions("metrics", **base)]  # type: ignore[arg-type]
    services += [ServeOptions("nodeagent", node=n.node_id, **base)  # type: ignore[arg-type]
                 for n in cluster.nodes]
    tasks = [asyncio.create_task(serve(o, stop)) for o in services]
    t_up = time.perf_counter()
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await ensure_stream(js)
    placed: dict[str, float] = {}
    waiter: dict[str, asyncio.Future[None]] = {}

    async def on_transition(msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, JobTransition) and body.state is JobState.RUNNING:
            placed.setdefault(body.job_id, time.perf_counter())
            fut = waiter.get(body.job_id)
            if fut is not None and not fut.done():
                fut.set_result(None)

    await nc.subscribe(subjects.JOB_TRANSITION, cb=on_transition)
    await asyncio.sleep(1.0)  # every durable consumer is bound
    print(f"{len(services)} services up in {time.perf_counter() - t_up:.1f} s "
          f"({args.nodes} node agents × {args.gpus_per_node} GPUs)")
    latencies = []
    for i in range(args.jobs + args.warmup):
        jid = f"bench-{i}"
        waiter[jid] = asyncio.get_running_loop().create_future()
        body = {"job_id": jid, "model": "resnet18", "gpus": 1 + i % args.gpus_per_node,
                "iterations": 1, "iteration_time_s": 0.001}
        t0 = time.perf_counter()
        await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                         headers={MSG_ID: f"submit.{jid}"})
        await asyncio.wait_for(waiter[jid], 30)
        if i >= args.warmup:
            latencies.append((placed[jid] - t0) * 1000)
    latencies.sort()

    def q(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    print(f"submit → placed over {len(latencies)} jobs: p50 {q(0.5):.1f} ms, "
          f"p90 {q(0.9):.1f} ms, p99 {q(0.99):.1f} ms, max {latencies[-1]:.1f} ms, "
          f"mean {statistics.mean(latencies):.1f} ms")
    await nc.close()
    stop.set()
    await asyncio.gather(*tasks)
    await server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--warmup", type=int, default=20)
    asyncio.run(main(p.parse_args()))
