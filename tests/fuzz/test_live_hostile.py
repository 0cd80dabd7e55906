"""Over 1,000 hostile payloads against live services on a real nats-server.

The scheduler, placer, metrics and a simulated node agent run as `loom serve` runs them
(in-process, each with its own connection and durable consumers). Payloads drawn by
hypothesis (tests/fuzz/payloads.py) go to the submit subject and to every internal subject
a service consumes, in batches with a valid job between batches. Every payload must be
dead-lettered on `loom.deadletter.<service>` with a reason, once per consuming service; the
services must still answer PING; the valid jobs must finish; and no hostile submission may
become a job.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import nats
import pytest
from nats.aio.client import Client as NATS

from loom.serve import ServeOptions, build_service, control_subject, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import DEAD_LETTER_KEEP, DeadLetter
from services.runtime.bus import MSG_ID
from services.runtime.natsserver import EmbeddedNats
from tests.fuzz.payloads import SAMPLE_BODIES, draw_many, edge_cases, hostile

pytestmark = pytest.mark.nats

PER_SUBJECT = 120  # x the 9 subjects the services consume
BATCHES = 10
VALID_JOBS = BATCHES
SERVICES = ("scheduler", "placer", "metrics", "nodeagent")


def options(service: str, url: str) -> ServeOptions:
    return ServeOptions(service, url, ClusterSpec.uniform(1, 1, 2), node="n0",
                        trainers="simulated", time_scale=1000.0)


def consumers(url: str) -> dict[str, list[str]]:
    """Subject → the services consuming it, from the cores' own subscriptions."""
    found: dict[str, list[str]] = {}
    for service in SERVICES:
        core = build_service(options(service, url)).core
        for sub in core.subscriptions():
            found.setdefault(sub.subject, []).append(core.name)
    return found


async def dead_letters(js: nats.js.JetStreamContext, count: int) -> list[DeadLetter]:
    sub = await js.subscribe(f"{subjects.DEADLETTER_PREFIX}.>", ordered_consumer=True)
    try:
        out = []
        for _ in range(count):
            body = decode((await sub.next_msg(timeout=10)).data).body
            assert isinstance(body, DeadLetter)
            out.append(body)
        return out
    finally:
        await sub.unsubscribe()


async def scheduler_jobs(nc: NATS) -> dict[str, str]:
    reply = await nc.request(control_subject("scheduler"), b"", timeout=5)
    return {j["job_id"]: j["state"] for j in json.loads(reply.data)["jobs"]}


async def test_hostile_payloads_are_dead_lettered_and_valid_jobs_still_finish(
        nats_server: EmbeddedNats) -> None:
    url = nats_server.url
    routes = consumers(url)
    assert set(routes) <= set(SAMPLE_BODIES), f"no hostile strategy for {set(routes)}"
    payloads = [(s, p) for s in sorted(routes)
                for p in draw_many(hostile(s), PER_SUBJECT) + edge_cases(s)]
    assert len(payloads) >= 1000
    expected = Counter((svc, s) for s, _ in payloads for svc in routes[s])

    stop = asyncio.Event()
    runs = [asyncio.create_task(serve(options(s, url), stop)) for s in SERVICES]
    nc = await nats.connect(url)
    try:
        for _ in range(300):
            if len(await ping(nc, 0.1)) == len(SERVICES):
                break
            assert not any(r.done() for r in runs), [r.exception() for r in runs if r.done()]
        else:
            pytest.fail(f"services did not come up: {await ping(nc)}")
        js = nc.jetstream()
        batch = len(payloads) // BATCHES + 1
        for i in range(BATCHES):
            for subject, payload in payloads[i * batch:(i + 1) * batch]:
                await nc.publish(subject, payload)
            job = {"job_id": f"ok-{i}", "model": "resnet18", "gpus": 1 + i % 2,
                   "iterations": 100, "iteration_time_s": 1.0}
            await js.publish(subjects.JOB_SUBMIT, json.dumps(job).encode(),
                             headers={MSG_ID: f"submit.ok-{i}"})
        await nc.flush()

        want = {f"ok-{i}": "finished" for i in range(VALID_JOBS)}
        for _ in range(3000):  # up to 5 minutes: a loaded CI machine is slow, not wrong
            info = await js.stream_info(subjects.DEADLETTER_STREAM,
                                        subjects_filter=f"{subjects.DEADLETTER_PREFIX}.>")
            stored = sum((info.state.subjects or {}).values())
            if stored >= sum(expected.values()) and await scheduler_jobs(nc) == want:
                break
            assert not any(r.done() for r in runs), [r.exception() for r in runs if r.done()]
            await asyncio.sleep(0.1)
        letters = await dead_letters(js, stored)
        got = Counter((d.service, d.subject) for d in letters)
        assert got == expected, f"missing {expected - got}, extra {got - expected}"
        assert all(d.reason for d in letters)
        sent = {p[:DEAD_LETTER_KEEP] for _, p in payloads}
        assert all(d.payload in sent for d in letters), "a dead letter keeps what was sent"
        assert await scheduler_jobs(nc) == want  # every valid job ran; no hostile one got in
        assert sorted(await ping(nc)) == ["metrics", "nodeagent-n0", "placer", "scheduler"]
    finally:
        stop.set()
        codes = await asyncio.gather(*runs, return_exceptions=True)
        await nc.close()
    assert codes == [0] * len(SERVICES)
