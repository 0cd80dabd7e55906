"""A log holding the scheduler's queue status (`loom.sched.queues`, as a live scheduler
publishes it after its cycles) replays OK: an observation, skipped like start forecasts, not
a decision the fresh scheduler must make."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loom.eventlog import Record, read_log
from loom.replay.cores import fresh_cores
from loom.replay.engine import recorded_envelope, replay
from schemas import subjects
from schemas.codec import encode
from schemas.events import PlanDecided, envelope
from schemas.queue_status import QueueState, QueueStatus, QuotaUsage
from tests.builders import cluster, make_job, simulate


def with_queue_status(records: list[Record]) -> list[Record]:
    """The records with a queue status from the scheduler after each of its plans."""
    out: list[Record] = []
    for rec in records:
        out.append(rec)
        env = recorded_envelope(rec)
        if env is not None and isinstance(env.body, PlanDecided):
            status = QueueStatus(at=rec.time, cycle=env.body.cycle, tenants_file=True, queues=(
                QueueState(name="q", quotas=(QuotaUsage(gpu_type="*", nominal=4),)),))
            sent = envelope(status, event_id=f"qs{rec.seq}", occurred_at=rec.time,
                            producer="scheduler", causation_id=None)
            out.append(dataclasses.replace(rec, subject=subjects.QUEUE_STATUS,
                                           msg_id=sent.event_id, data=encode(sent)))
    return [dataclasses.replace(r, index=i + 1) for i, r in enumerate(out)]


def test_a_log_with_queue_status_replays_to_the_same_digest(tmp_path: Path) -> None:
    jobs = [make_job(f"j{i}").gpus(1 + i % 3).runs_for(200.0 + 37 * i).submit(15.0 * i).build()
            for i in range(12)]
    path = tmp_path / "run.eventlog.gz"
    run = simulate(jobs, "srtf", cluster(nodes=1, gpus_per_node=4), log=path)
    log = read_log(path)
    log.records = with_queue_status(log.records)
    assert sum(r.subject == subjects.QUEUE_STATUS for r in log.records) > 3
    result = replay(log, fresh_cores(log))
    assert result.ok, result.divergence.render() if result.divergence else ""
    assert result.digest == run.summary["decision_digest"]
