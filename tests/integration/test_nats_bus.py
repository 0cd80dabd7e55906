"""NatsSimBus against a real nats-server: de-duplication, dead letters, JSON, isolation, wire."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import msgpack
import pytest

from loom.simulate import SimConfig, run_simulation
from schemas import subjects
from schemas.codec import decode, encode
from schemas.events import (
    DEAD_LETTER_KEEP,
    CycleStarted,
    DeadLetter,
    Envelope,
    JobTransition,
    envelope,
)
from schemas.job import SubmitJob
from services.injector.core import InjectorCore
from services.runtime import nats_bus as nats_bus_module
from services.runtime.bus import MSG_ID, Bus, MemoryBus, decode_submit
from services.runtime.kernel import SimKernel
from services.runtime.nats_bus import NatsSimBus
from services.runtime.natsserver import EmbeddedNats
from tests.builders import cluster, make_job
from tests.integration.pipeline import (
    Collector,
    RecordingBus,
    build_pipeline,
    nats_bus,
    probe,
    stream_messages,
)

JOB = {"model": "resnet50", "gpus": 4, "iterations": 100, "iteration_time_s": 1}


def _cycle(event_id: str, cycle: int = 1) -> Envelope:
    return envelope(CycleStarted(cycle=cycle, trigger="test"), event_id=event_id,
                    occurred_at=0.0, producer="test", causation_id=None)


def _wire_envelope(body: dict[str, object], etype: str = "loom.job.submit.v1") -> bytes:
    packed: bytes = msgpack.packb({"type": etype, "event_id": "bad-1", "causation_id": None,
                                   "occurred_at": 0.0, "producer": "test", "body": body})
    return packed


BusFactory = Callable[[SimKernel, str], AbstractAsyncContextManager[Bus]]


@pytest.fixture(params=["memory", "nats"])
def make_bus(request: pytest.FixtureRequest, nats_server: EmbeddedNats) -> BusFactory:
    @asynccontextmanager
    async def factory(kernel: SimKernel, run_id: str) -> AsyncIterator[Bus]:
        if request.param == "memory":
            yield MemoryBus(kernel)
        else:
            async with nats_bus(nats_server.url, run_id, kernel) as bus:
                yield bus

    return factory


# -- (a) de-duplication -----------------------------------------------------------------------
async def test_duplicate_event_id_is_stored_once_and_delivered_once(
    nats_server: EmbeddedNats,
) -> None:
    kernel = SimKernel()
    async with nats_bus(nats_server.url, "dedupe", kernel) as bus:
        got = Collector()
        await bus.subscribe(subjects.CYCLE_STARTED, got, durable="t")
        assert await bus.publish(subjects.CYCLE_STARTED, _cycle("same", 1)) is True
        # Same id, different body: JetStream must keep the first and the bus must not deliver.
        assert await bus.publish(subjects.CYCLE_STARTED, _cycle("same", 2)) is False
        raw = encode(_cycle("x", 9))
        assert await bus.publish_raw(subjects.CYCLE_STARTED, raw, msg_id="same") is False
        # A later message proves the server processed the duplicates before it (stream order).
        assert await bus.publish(subjects.CYCLE_STARTED, _cycle("other", 3)) is True
        await kernel.run()
        assert [(e.event_id, e.body.cycle) for e in got.got] == [("same", 1), ("other", 3)]  # type: ignore[attr-defined]
        assert bus.stats.duplicates == 2 and bus.stats.published == 2
        assert bus.stats.delivered == 2

        info = await bus.js.stream_info(bus.stream)
        assert info.state.messages == 2
        first = await bus.js.get_msg(bus.stream, info.state.first_seq)
        assert first.headers[MSG_ID] == "same"
        assert decode(first.data) == _cycle("same", 1)


async def test_duplicate_raw_json_submission_makes_one_job(nats_server: EmbeddedNats) -> None:
    kernel = SimKernel()
    async with nats_bus(nats_server.url, "dedupe-json", kernel) as bus:
        got = Collector()
        await bus.subscribe(subjects.JOB_SUBMIT, got, durable="scheduler", decoder=decode_submit)
        payload = json.dumps(JOB).encode()
        assert await bus.publish_raw(subjects.JOB_SUBMIT, payload, msg_id="alice-1") is True
        assert await bus.publish_raw(subjects.JOB_SUBMIT, payload, msg_id="alice-1") is False
        await kernel.run()
        assert len(got.got) == 1
        assert (await bus.js.stream_info(bus.stream)).state.messages == 1


# -- (b) dead letters ---------------------------------------------------------------------------
BAD_PAYLOADS = [
    pytest.param(b"\xc1\x00 definitely not msgpack", "not msgpack", id="not-msgpack"),
    pytest.param(msgpack.packb([1, 2, 3]), "an envelope must be a map", id="msgpack-list"),
    pytest.param(msgpack.packb({"hello": "world"}), "unknown event type None", id="no-type"),
    pytest.param(_wire_envelope({**JOB, "gpus": 0}),
                 "invalid loom.job.submit.v1: gpus: got 0; allowed: a number of at least 1",
                 id="gpus-zero"),
    pytest.param(_wire_envelope({**JOB, "colour": "red"}),
                 "invalid loom.job.submit.v1: colour: not a field Loom knows",
                 id="extra-field"),
    pytest.param(_wire_envelope({}, etype="loom.job.teleport.v1"),
                 "unknown event type 'loom.job.teleport.v1'", id="unknown-type"),
]


@pytest.mark.parametrize(("payload", "reason"), BAD_PAYLOADS)
async def test_malformed_payload_is_dead_lettered_and_delivery_goes_on(
    payload: bytes, reason: str, nats_server: EmbeddedNats
) -> None:
    kernel = SimKernel()
    async with nats_bus(nats_server.url, "dlq", kernel) as bus, probe(nats_server.url) as nc:
        got = Collector()
        await bus.subscribe(subjects.CYCLE_STARTED, got, durable="svc")
        assert await bus.publish_raw(subjects.CYCLE_STARTED, payload)
        assert await bus.publish(subjects.CYCLE_STARTED, _cycle("after", 7))
        await kernel.run()

        assert [e.event_id for e in got.got] == ["after"]
        assert bus.stats.dead_lettered == 1
        await bus.nc.flush()
        last = await nc.jetstream().get_last_msg(bus.stream, f"{bus.prefix}loom.deadletter.svc")
        dl = decode(last.data)
        assert last.headers[MSG_ID] == dl.event_id
        assert isinstance(dl.body, DeadLetter)
        assert dl.body.subject == subjects.CYCLE_STARTED
        assert dl.body.service == "svc"
        assert dl.body.payload == payload
        assert reason in dl.body.reason, dl.body.reason


SUBMIT_BAD = [
    pytest.param(b'{"model": "m", "gpus": 2', "invalid JSON at line 1", id="truncated-json"),
    pytest.param(b'{"model": "m", "gpus": 0, "iterations": 1, "iteration_time_s": 1}',
                 "invalid job: gpus: got 0; allowed: a number of at least 1", id="gpus-zero"),
    pytest.param(b'{"gpus": 1, "iterations": 1, "iteration_time_s": 1}',
                 "invalid job: model: required, but missing", id="no-model"),
    pytest.param(b"\xc1", "not msgpack", id="garbage"),
    # Payloads that make the decoder raise something other than CodecError: still dead-lettered.
    pytest.param(b'{"model": "\xff\xfe", "gpus": 1, "iterations": 1, "iteration_time_s": 1}',
                 "invalid", id="invalid-utf8-json"),
    pytest.param(b'{"type": ["x"], "body": {}}', "unknown event type", id="unhashable-type-json"),
    pytest.param(msgpack.packb({"type": {"a": 1}, "body": {}}), "unknown event type",
                 id="unhashable-type-msgpack"),
    pytest.param(b'{"a":' * 5000, "invalid JSON", id="deeply-nested-json"),
]


@pytest.mark.parametrize(("payload", "reason"), SUBMIT_BAD)
async def test_bad_submission_is_dead_lettered_on_both_buses(
    payload: bytes, reason: str, make_bus: BusFactory
) -> None:
    kernel = SimKernel()
    async with make_bus(kernel, "dlq-submit") as bus:
        got = Collector()
        dead = Collector()
        await bus.subscribe(subjects.JOB_SUBMIT, got, durable="scheduler", decoder=decode_submit)
        await bus.subscribe("loom.deadletter.>", dead, durable="audit")
        await bus.publish_raw(subjects.JOB_SUBMIT, payload)
        await bus.publish_raw(subjects.JOB_SUBMIT, json.dumps(JOB).encode())
        await kernel.run()

        assert len(got.got) == 1 and isinstance(got.got[0].body, SubmitJob)
        assert len(dead.got) == 1
        body = dead.got[0].body
        assert isinstance(body, DeadLetter)
        # A dead letter keeps the payload's start (the whole one stays in the stream).
        assert body.service == "scheduler" and body.payload == payload[:DEAD_LETTER_KEEP]
        assert reason in body.reason, body.reason


# -- (c) JSON on the submit subject ---------------------------------------------------------------
async def test_plain_json_job_reaches_a_decode_submit_subscriber(
    nats_server: EmbeddedNats,
) -> None:
    kernel = SimKernel(start=42.0)
    async with nats_bus(nats_server.url, "json", kernel) as bus:
        got = Collector()
        await bus.subscribe(subjects.JOB_SUBMIT, got, durable="scheduler", decoder=decode_submit)
        await bus.publish_raw(subjects.JOB_SUBMIT, b'  ' + json.dumps(JOB).encode())
        # A JSON envelope and a msgpack envelope on the same subject are accepted too.
        spec = make_job("j-env").gpus(2).runs_for(10).build()
        env = envelope(SubmitJob.from_spec(spec), event_id="env-1", occurred_at=1.0,
                       producer="cli", causation_id=None)
        as_json = {**env.to_dict(), "body": json.loads(env.body.model_dump_json())}
        await bus.publish_raw(subjects.JOB_SUBMIT, json.dumps(as_json).encode())
        await bus.publish(subjects.JOB_SUBMIT, envelope(
            SubmitJob.from_spec(spec), event_id="env-2", occurred_at=2.0, producer="cli",
            causation_id=None))
        await kernel.run()

        assert len(got.got) == 3
        bare, from_json, from_msgpack = got.got
        assert isinstance(bare.body, SubmitJob)
        assert bare.body == SubmitJob.model_validate(JOB)
        assert bare.type == "loom.job.submit.v1"
        assert bare.producer == "submitter" and bare.occurred_at == 42.0
        assert bare.event_id.startswith("seq.")  # no Nats-Msg-Id: the stream sequence names it
        assert from_json == env
        assert from_msgpack.event_id == "env-2" and from_msgpack.body == env.body


async def test_bare_json_job_is_named_by_its_nats_msg_id(nats_server: EmbeddedNats) -> None:
    kernel = SimKernel()
    async with nats_bus(nats_server.url, "json-id", kernel) as bus:
        got = Collector()
        await bus.subscribe(subjects.JOB_SUBMIT, got, durable="scheduler", decoder=decode_submit)
        await bus.publish_raw(subjects.JOB_SUBMIT, json.dumps(JOB).encode(), msg_id="alice-1")
        await kernel.run()
        assert [e.event_id for e in got.got] == ["alice-1"]


# -- (d) a shared server ------------------------------------------------------------------------
async def test_runs_on_a_shared_server_are_isolated(nats_server: EmbeddedNats) -> None:
    ka, kb = SimKernel(), SimKernel()
    async with (nats_bus(nats_server.url, "run.alpha", ka) as a,
                nats_bus(nats_server.url, "run beta", kb) as b,
                probe(nats_server.url) as nc):
        assert a.stream != b.stream and a.prefix != b.prefix
        # Named after the run (cleaned up), plus a random suffix so re-runs never collide.
        assert a.stream.startswith("LOOMSIM_run_alpha_")
        assert a.prefix == f"sim.{a.stream.removeprefix('LOOMSIM_')}."
        got_a, got_b = Collector(), Collector()
        await a.subscribe("loom.>", got_a, durable="t")
        await b.subscribe("loom.>", got_b, durable="t")
        # The same event ids in both runs: each stream de-duplicates on its own.
        for i in range(3):
            assert await a.publish(subjects.CYCLE_STARTED, _cycle(f"e{i}", i))
        for i in range(5):
            assert await b.publish(subjects.CYCLE_STARTED, _cycle(f"e{i}", 100 + i))
        await kb.run()
        await ka.run()
        assert [e.body.cycle for e in got_a.got] == [0, 1, 2]  # type: ignore[attr-defined]
        assert [e.body.cycle for e in got_b.got] == [100, 101, 102, 103, 104]  # type: ignore[attr-defined]

        await a.nc.flush()
        await b.nc.flush()
        msgs_a = await stream_messages(nc, a.stream)
        msgs_b = await stream_messages(nc, b.stream)
        assert len(msgs_a) == 3 and len(msgs_b) == 5
        assert all(m.subject == f"{a.prefix}loom.sched.cycle" for m in msgs_a)
        assert all(m.subject == f"{b.prefix}loom.sched.cycle" for m in msgs_b)
        # Nothing leaked onto the unprefixed subjects a live deployment uses.
        names = [s.config.name for s in await nc.jetstream().streams_info()]
        assert sorted(names) == sorted([a.stream, b.stream])


async def test_two_simulations_share_a_server_with_different_run_ids(
    nats_server: EmbeddedNats,
) -> None:
    jobs = [make_job(f"s{i}").gpus(1 + i % 4).runs_for(100 + 37 * i).submit(10.0 * i).build()
            for i in range(8)]

    def cfg(seed: int) -> SimConfig:
        return SimConfig(policy="srtf", jobs=jobs, cluster=cluster(2, 4), bus="nats",
                         nats_url=nats_server.url, seed=seed)

    one = await run_simulation(cfg(1))
    two = await run_simulation(cfg(2))
    assert one.summary["finished"] == two.summary["finished"] == 8
    assert one.summary["decision_digest"] == two.summary["decision_digest"]
    assert one.summary["errors"] == two.summary["errors"] == 0


async def test_rerunning_the_same_simulation_on_a_shared_server(
    nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nats_bus_module, "NEXT_TIMEOUT_S", 2.0)  # fail in 2 s, not 30 s
    jobs = [make_job(f"r{i}").gpus(2).runs_for(50).submit(5.0 * i).build() for i in range(4)]
    cfg = SimConfig(policy="fifo", jobs=jobs, cluster=cluster(1, 4), bus="nats",
                    nats_url=nats_server.url)
    first = await run_simulation(cfg)
    second = await run_simulation(cfg)
    assert second.summary["decision_digest"] == first.summary["decision_digest"]


# -- (e) what is on the wire ------------------------------------------------------------------
async def test_stream_holds_every_envelope_with_its_id_and_round_trips(
    nats_server: EmbeddedNats,
) -> None:
    jobs = [make_job(f"w{i}").gpus([1, 2, 4, 8][i % 4]).runs_for(60 + 45 * i).submit(7.0 * i)
            .build() for i in range(10)]
    cl = cluster(2, 4)

    mem_kernel = SimKernel()
    mem_bus = RecordingBus(MemoryBus(mem_kernel))
    mem = build_pipeline(mem_kernel, mem_bus, cl, "srtf", extra=[InjectorCore(jobs)])
    await mem.start()
    await mem_kernel.run()

    kernel = SimKernel()
    async with probe(nats_server.url) as nc:
        inner = await NatsSimBus.open(kernel, nats_server.url, run_id="wire")
        bus = RecordingBus(inner)
        try:
            pipe = build_pipeline(kernel, bus, cl, "srtf", extra=[InjectorCore(jobs)])
            await pipe.start()
            await kernel.run()
        finally:
            await bus.close()
        msgs = await stream_messages(nc, inner.stream)

    assert pipe.metrics.finished == mem.metrics.finished == 10
    assert pipe.errors == 0 and inner.stats.dead_lettered == 0
    assert pipe.metrics.digest == mem.metrics.digest
    # The two buses carried exactly the same envelopes, in the same order.
    assert bus.published == mem_bus.published
    assert any(isinstance(e.body, JobTransition) for _, e in bus.published)  # type: ignore[union-attr]

    assert len(msgs) == len(bus.published) == inner.stats.published
    for msg, (subject, env) in zip(msgs, bus.published, strict=True):
        assert isinstance(env, Envelope)
        assert msg.subject == inner.prefix + subject
        assert msg.headers[MSG_ID] == env.event_id
        assert decode(msg.data) == env
