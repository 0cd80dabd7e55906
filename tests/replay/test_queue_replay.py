"""A simulation run with a tenants file replays: the log's header keeps the file (quotas,
queues), so the rebuilt scheduler holds, borrows and reclaims as the recorded one did."""

from __future__ import annotations

import asyncio
from pathlib import Path

from loom.eventlog import read_log
from loom.replay.cores import fresh_cores
from loom.replay.engine import replay
from loom.replay.whatif import what_if
from tests.builders import cluster, simulate
from tests.policies.test_queue_reclaim_sim import TENANTS, workload


def test_a_log_with_queues_replays_to_its_digest(tmp_path: Path) -> None:
    path = tmp_path / "queues.eventlog.gz"
    run = simulate(workload(), "srtf", cluster(3, 8), tenants=TENANTS, log=path)
    assert run.summary["reclaims"] == 8  # the run did exercise the queues
    log = read_log(path)
    assert log.run.tenants == TENANTS.model_dump(mode="json")
    result = replay(log, fresh_cores(log))
    assert result.ok, result.divergence.render() if result.divergence else ""
    assert result.digest == run.summary["decision_digest"]
    # A what-if keeps the queues too: the log's arrivals under tiresias, as simulated.
    other = asyncio.run(what_if(log, "tiresias"))
    direct = simulate(workload(), "tiresias", cluster(3, 8), tenants=TENANTS)
    assert other.summary["decision_digest"] == direct.summary["decision_digest"]
    assert other.summary["reclaims"] == direct.summary["reclaims"] == 8
