"""The chaos test: 200 jobs on 8 node agents over real NATS with file storage, two scheduler
replicas, and mid-run a kill -9 of a node agent, of the leading scheduler and of the
nats-server (restarted on the same store). The exported stream must show every job finished
exactly once, no GPU ever held by two jobs, no job without its end, no gap in the stream."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import nats
import pytest

from schemas import subjects
from schemas.cluster import ClusterSpec
from tests.builders import make_job
from tests.chaos.harness import (
    FinishWatch,
    LiveCluster,
    NatsProcess,
    audit,
    history,
    lease_holder,
    read_all,
    submit,
    wait_services,
)

pytestmark = [pytest.mark.nats, pytest.mark.chaos]
NODES = [f"n{i}" for i in range(8)]
REPLICAS = ("scheduler-a", "scheduler-b")
JOBS = 200


def trace(seed: int = 0) -> list:  # type: ignore[type-arg]
    """1-, 2- and 4-GPU jobs of 10-40 cluster seconds (0.5-2 s at a time scale of 20)."""
    rng = random.Random(seed)
    return [make_job(f"job{i:03d}").gpus(rng.choice((1, 1, 1, 2, 2, 4)))
            .iterations(rng.randint(10, 40)).iteration_time(1.0).build()
            for i in range(JOBS)]


async def test_chaos(tmp_path: Path) -> None:
    server = NatsProcess(tmp_path)
    await server.start()
    spec = ClusterSpec.uniform(2, len(NODES) // 2, 4)
    live = LiveCluster(server.url, LiveCluster.write_cluster(tmp_path, spec), tmp_path,
                       time_scale=20.0)
    jobs = trace()
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    timeline: list[str] = []
    t0 = time.monotonic()

    def note(what: str) -> None:
        timeline.append(f"{time.monotonic() - t0:6.1f}s {what}")

    try:
        for name in ("placer", *REPLICAS, *NODES):
            live.start(name)
        await wait_services(nc, 1 + len(REPLICAS) + len(NODES))
        note("all services up")
        watch = FinishWatch(nc)
        batches = [jobs[i:i + 50] for i in range(0, JOBS, 50)]
        await submit(nc, batches[0])

        assert await watch.until(20, 180)
        live.kill9("n3")
        note(f"kill -9 node agent n3 ({len(watch.finished)} finished)")
        await submit(nc, batches[1])
        await asyncio.sleep(1.0)
        live.start("n3")

        assert await watch.until(60, 180)
        leader = await lease_holder(nc)
        assert leader is not None and leader.holder in REPLICAS
        live.kill9(leader.holder)
        note(f"kill -9 leader {leader.holder}, term {leader.term} "
             f"({len(watch.finished)} finished)")
        await submit(nc, batches[2])
        await asyncio.sleep(2.0)
        live.start(leader.holder)  # back as a standby

        assert await watch.until(110, 180)
        server.kill()
        note(f"kill -9 nats-server ({len(watch.finished)} finished)")
        await asyncio.sleep(1.0)
        await server.start()
        note("nats-server restarted on the same store")
        await submit(nc, batches[3])

        done = await watch.until(JOBS, 300)
        note(f"{len(watch.finished)} finished")
        # Dead letters have a stream of their own; the audit counts them, in any order.
        stream = await read_all(nc) + await read_all(nc, subjects.DEADLETTER_STREAM)
        report = audit(stream, [j.job_id for j in jobs])
        final = await lease_holder(nc)
    finally:
        await nc.close()
        bad = live.stop_all()
        server.kill()
    print("\n" + "\n".join(timeline))
    print(f"stream: {report.messages} messages, terms {report.terms}, "
          f"{report.preemptions} preemptions, {report.stale_plans_refused} stale plans "
          f"refused; lease now {final}")
    missing = {j: history(stream, j) for j in report.unfinished}
    assert done, (f"{len(watch.finished)} of {JOBS} finished; unfinished: {missing}; "
                  f"dead letters: {report.dead_letters}")
    assert report.ok, (report, {j: history(stream, j) for j in report.suspects})
    assert not report.dead_letters, report.dead_letters
    assert len(report.terms) >= 2 and report.terms == sorted(report.terms)  # a takeover
    assert bad == [], bad
