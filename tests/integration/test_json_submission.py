"""End to end: a person's `nats pub loom.jobs.submit '{...}'` is admitted, runs and finishes."""

from __future__ import annotations

import json

from schemas import subjects
from schemas.job import JobState
from services.runtime.effects import PRIORITY_INPUT
from services.runtime.kernel import SimKernel
from services.runtime.natsserver import EmbeddedNats
from tests.builders import cluster
from tests.integration.pipeline import Collector, build_pipeline, nats_bus, probe, stream_messages


async def test_plain_json_jobs_are_admitted_run_and_finish_on_nats(
    nats_server: EmbeddedNats,
) -> None:
    kernel = SimKernel()
    async with nats_bus(nats_server.url, "json-e2e", kernel) as bus:
        pipe = build_pipeline(kernel, bus, cluster(2, 4), "fifo")
        dead = Collector()
        await bus.subscribe("loom.deadletter.>", dead, durable="audit")
        await pipe.start()

        # At t=0, exactly what the README's `nats pub` example sends (no id, no submit time).
        await bus.publish_raw(subjects.JOB_SUBMIT, json.dumps(
            {"model": "resnet50", "gpus": 4, "iterations": 100, "iteration_time_s": 1}).encode())

        # At t=50: one with its own id, one too large for the cluster, one that is not a job.
        async def later() -> None:
            await bus.publish_raw(subjects.JOB_SUBMIT, json.dumps(
                {"job_id": "alice-7", "model": "bert", "gpus": 8, "iterations": 20,
                 "iteration_time_s": 2.5, "tenant": "alice"}).encode())
            await bus.publish_raw(subjects.JOB_SUBMIT, json.dumps(
                {"job_id": "huge", "model": "gpt", "gpus": 64, "iterations": 1,
                 "iteration_time_s": 1}).encode())
            await bus.publish_raw(subjects.JOB_SUBMIT, b'{"model": "oops", "gpus": -1}')

        kernel.schedule(50.0, PRIORITY_INPUT, later)
        await kernel.run()
        await bus.nc.flush()
        stream = bus.stream

    m = pipe.metrics
    assert m.finished == 2 and m.rejected == 1, m.summary()
    assert pipe.errors == 0

    anon = [j for j in m.jobs.values() if j.model == "resnet50"]
    assert len(anon) == 1
    first = anon[0]
    assert first.job_id.startswith("job-")  # named by the scheduler from the message id
    assert first.state is JobState.FINISHED
    assert (first.submit_s, first.start_s, first.end_s) == (0.0, 0.0, 100.0)
    assert first.gpus == 4

    alice = m.jobs["alice-7"]
    assert alice.tenant == "alice" and alice.gpus == 8
    assert alice.state is JobState.FINISHED
    assert alice.submit_s == 50.0  # stamped with the time the scheduler received it
    # 8 GPUs: it waits for resnet50 to release its 4 at t=100, then runs 50 s.
    assert (alice.start_s, alice.end_s) == (100.0, 150.0)

    assert m.jobs["huge"].state is JobState.REJECTED
    assert "64" in m.jobs["huge"].cause

    # The non-job was dead-lettered by the bus with what is wrong, and nothing else was.
    assert len(dead.got) == 1
    reason = dead.got[0].body.reason  # type: ignore[attr-defined]
    assert "gpus" in reason and "iterations" in reason, reason
    assert pipe.scheduler.active == 0

    # Every submission is on the stream as sent: a replay starts from the raw JSON.
    async with probe(nats_server.url) as nc:
        msgs = await stream_messages(nc, stream)
    submits = [m for m in msgs if m.subject.endswith(subjects.JOB_SUBMIT)]
    assert [json.loads(s.data)["model"] for s in submits] == ["resnet50", "bert", "gpt", "oops"]
