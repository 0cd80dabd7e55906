"""kill -9 of the scheduler process mid-run: restarted, it rebuilds from the stream and every
job still finishes exactly once (real `loom serve` processes over a real nats-server)."""

from __future__ import annotations

import time
from pathlib import Path

import nats
import pytest

from schemas.cluster import ClusterSpec
from tests.builders import make_job
from tests.chaos.harness import (
    FinishWatch,
    LiveCluster,
    NatsProcess,
    audit,
    read_all,
    submit,
    wait_services,
)

pytestmark = pytest.mark.nats
NODES = ("n0", "n1")


async def test_killed_scheduler_restarts_and_every_job_finishes_once(tmp_path: Path) -> None:
    server = NatsProcess(tmp_path)
    await server.start()
    spec = ClusterSpec.uniform(1, len(NODES), 2)
    live = LiveCluster(server.url, LiveCluster.write_cluster(tmp_path, spec), tmp_path,
                       time_scale=20.0)
    # 16 jobs of 10-40 cluster seconds (0.5-2 s here) on 4 GPUs; srtf preempts.
    jobs = [make_job(f"j{i:02d}").gpus(1 + i % 2).iterations(10 + 10 * (i % 4))
            .iteration_time(1.0).build() for i in range(16)]
    nc = await nats.connect(server.url)
    try:
        for name in ("placer", "scheduler", *NODES):
            live.start(name)
        await wait_services(nc, 2 + len(NODES))
        watch = FinishWatch(nc)
        await submit(nc, jobs[:10])
        assert await watch.until(3, 60)
        live.kill9("scheduler")  # mid-run: jobs running, queued, finished
        await submit(nc, jobs[10:])  # it is away: these wait in the stream
        started = time.monotonic()
        live.start("scheduler")
        assert await watch.until(len(jobs), 120), sorted(watch.finished)
        recovery_s = time.monotonic() - started
        report = audit(await read_all(nc), [j.job_id for j in jobs])
    finally:
        await nc.close()
        bad = live.stop_all()
        server.kill()
    assert report.ok, report
    assert not report.dead_letters, report.dead_letters
    assert bad == [], bad
    print(f"recovered and finished the rest in {recovery_s:.1f} s; "
          f"{report.messages} messages, {report.preemptions} preemptions")
