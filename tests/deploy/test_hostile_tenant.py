"""A hostile tenant against a cluster secured as shipped (deploy/nats/auth.conf): services,
two node agents running real processes on fake GPUs, each logged in as itself. Every attack
of issue 25 is tried and refused, nothing legitimate is lost, and no GPU stays with a job that
has no process for longer than the launch timeout.

- credential theft: a job reads its environment for the node agent's password;
- forged events: with a node's credentials, finish or report on a job on another node;
- inbox snooping: subscribe where services and other people get their replies;
- flooding: messages over the people's 64 KiB cap, and hundreds of junk submissions;
- path ids and jobs no trainer can run: ids that name paths, an unknown model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest

from schemas import subjects
from schemas.codec import encode
from schemas.events import DEAD_LETTER_KEEP, JobFinished, NodeStatus, envelope
from services.runtime.nats_live import ensure_stream
from tests.deploy.secure_cluster import (
    Server,
    Services,
    Tls,
    connect,
    password,
    publish_denied,
    stored,
)

# tls.conf has the same accounts; auth.conf spares the TLS handshakes.
pytestmark = [pytest.mark.nats, pytest.mark.parametrize("server", ["auth.conf"], indirect=True)]

NODES = ("n0", "n1")
LAUNCH_TIMEOUT_S = 5.0


@dataclass
class Cluster:
    services: Services
    admin: Any
    server: Server
    tls: Tls
    tmp: Path

    async def dead_letters(self) -> list[dict[str, Any]]:
        """Every dead letter stored so far, decoded (their own stream)."""
        js = self.admin.jetstream()
        info = await js.stream_info(subjects.DEADLETTER_STREAM)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            msg = await js.get_msg(subjects.DEADLETTER_STREAM, seq)
            out.append({"subject": msg.subject, "size": len(msg.data),
                        **msgpack.unpackb(msg.data, raw=False)["body"]})
        return out

    async def wait_dead_letters(self, count: int, timeout_s: float = 20.0
                                ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(letters := await self.dead_letters()) < count:
            assert time.monotonic() < deadline, f"{len(letters)} of {count} dead letters"
            await asyncio.sleep(0.1)
        return letters


@pytest.fixture
async def cluster(server: Server, tls: Tls, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """Scheduler, placer, metrics and agents of n0 and n1 (one GPU each); the agents hold
    a node's credentials in their environment, as their systemd units do."""
    from schemas.cluster import ClusterSpec

    monkeypatch.setenv("LOOM_NATS_USER", "node-n0")
    monkeypatch.setenv("LOOM_NATS_PASSWORD", password("node-n0"))
    admin = await connect("admin", server, tls)
    await ensure_stream(admin.jetstream())
    services = Services(server, tls, admin, tmp_path / "checkpoints",
                        cluster=ClusterSpec.uniform(1, len(NODES), 1),
                        launch_timeout_s=LAUNCH_TIMEOUT_S)
    try:
        for service in ("scheduler", "placer", "metrics", *(f"nodeagent-{n}" for n in NODES)):
            await services.start(service)
        yield Cluster(services, admin, server, tls, tmp_path)
        jobs = await services.jobs()
        assert all(j["state"] != "running" for j in jobs.values()), jobs  # no GPU left held
    finally:
        codes = await services.stop_all()
        await admin.close()
    assert codes == [0] * len(codes)


async def test_a_job_cannot_read_its_node_agents_credentials(cluster: Cluster) -> None:
    dump = cluster.tmp / "environ.json"
    await cluster.services.submit(
        "thief", sys.executable, "-c",
        f"import json, os; open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)));"
        "print('LOOM_PROGRESS iteration=5')")
    await cluster.services.wait_for("thief", "finished")
    seen = json.loads(dump.read_text())
    assert not [k for k in seen if k.startswith("LOOM_NATS")], sorted(seen)
    assert not [k for k, v in seen.items() if password("node-n0") in v]


def report(body: Any, n: int) -> bytes:
    return encode(envelope(body, event_id=f"forged-{n}", occurred_at=0.0, producer="evil",
                           causation_id=None))


async def test_forged_reports_from_another_node_are_refused(cluster: Cluster) -> None:
    services = cluster.services
    await services.submit("victim", sys.executable, "-c",
                          "import time; time.sleep(3); print('LOOM_PROGRESS iteration=5')")
    victim = await services.wait_for("victim", "running")
    (home,) = victim["nodes"]
    (other,) = [n for n in NODES if n != home]
    errors: list[str] = []
    thief = await connect(f"node-{other}", cluster.server, cluster.tls, errors)  # stolen
    try:
        js = thief.jetstream()
        own = subjects.node_subject(other, subjects.FINISHED)
        # All its work, done, says the other node: never placed there.
        await js.publish(own, report(JobFinished(job_id="victim", node_id=other,
                                                 iterations_done=5.0), 1))
        # ... naming the victim's node in the body, on its own subject: not its to name.
        await js.publish(own, report(JobFinished(job_id="victim", node_id=home,
                                                 iterations_done=5.0), 2))
        await js.publish(subjects.node_subject(other, subjects.STATUS), report(
            NodeStatus(node_id=other, cycle=1, progress={"victim": 5.0}), 3))
        # On the victim's node's subject: the server refuses it.
        await publish_denied(thief, errors, subjects.node_subject(home, subjects.FINISHED))
    finally:
        await thief.close()
    letters = await cluster.wait_dead_letters(5)
    reasons = sorted((d["service"], d["reason"]) for d in letters)
    assert sum("never placed there" in r for _, r in reasons) == 2, reasons  # finish, status
    assert sum("never bound there" in r for _, r in reasons) == 1, reasons  # the placer's
    assert sum(f"names node '{home}'" in r for _, r in reasons) == 2, reasons  # both buses
    assert (await services.jobs())["victim"]["state"] == "running"  # untouched
    done = await services.wait_for("victim", "finished")
    assert done["done"] == 5.0


async def test_no_one_subscribes_to_another_clients_inbox(cluster: Cluster) -> None:
    attempts = {"submitter": ["_INBOX.>", "_INBOX.scheduler.>", "_INBOX.operator.>", "loom.>",
                              ">"],
                "operator": ["_INBOX.>", "_INBOX.submitter.>", "_INBOX.scheduler.>", "loom.>"],
                f"node-{NODES[1]}": ["_INBOX.>", "_INBOX.scheduler.>",
                                     f"_INBOX.node-{NODES[0]}.>"]}
    for user, patterns in attempts.items():
        errors: list[str] = []
        nc = await connect(user, cluster.server, cluster.tls, errors)
        try:
            for pattern in patterns:
                await nc.subscribe(pattern)
            await nc.flush()
            for _ in range(100):
                if len(errors) >= len(patterns):
                    break
                await asyncio.sleep(0.02)
        finally:
            await nc.close()
        refused = [p for p in patterns
                   if any("permissions violation for subscription" in e.lower()
                          and f'"{p.lower()}"' in e.lower() for e in errors)]
        assert refused == patterns, (user, errors)
    # Its own inbox, listened on while another person submits a job with a secret: nothing.
    heard: list[bytes] = []

    async def hear(msg: Any) -> None:
        heard.append(msg.data)

    snoop = await connect("submitter", cluster.server, cluster.tls)
    operator = await connect("operator", cluster.server, cluster.tls)
    try:
        await snoop.subscribe("_INBOX.submitter.>", cb=hear)
        body = {"job_id": "secretive", "model": "mnist-like", "gpus": 1, "iterations": 5,
                "iteration_time_s": 1.0,
                "command": [sys.executable, "-c", "print('LOOM_PROGRESS iteration=5')"],
                "env": {"WANDB_API_KEY": "s3cr3t"}}
        await operator.jetstream().publish(subjects.JOB_SUBMIT, json.dumps(body).encode())
        await cluster.services.wait_for("secretive", "finished")
    finally:
        await snoop.close()
        await operator.close()
    assert heard == []


async def test_a_flood_is_capped_and_loses_nothing(cluster: Cluster) -> None:
    js = cluster.admin.jetstream()
    before = await stored(js, subjects.JOB_SUBMIT)
    # Over the people's 64 KiB cap: the server cuts the connection and stores nothing.
    for _ in range(3):
        nc = await connect("submitter", cluster.server, cluster.tls)
        try:
            await nc.publish(subjects.JOB_SUBMIT, b"x" * (1024 * 1024 - 4096))
            with contextlib.suppress(Exception):  # the flush fails as the server cuts in
                await nc.flush(timeout=2)
            for _ in range(100):
                if nc.is_closed:
                    break
                await asyncio.sleep(0.02)
            cut = nc.is_closed  # by the server: this client never closed it
        finally:
            await nc.close()
        assert cut
    assert await stored(js, subjects.JOB_SUBMIT) == before
    # Under the cap: each junk submission is stored, and dead-lettered with a short copy.
    junk = 300
    nc = await connect("submitter", cluster.server, cluster.tls)
    try:
        flood = nc.jetstream()
        for n in range(junk):
            await flood.publish(subjects.JOB_SUBMIT, bytes([n % 256]) * (60 * 1024),
                                headers={"Nats-Msg-Id": f"junk-{n}"})
    finally:
        await nc.close()
    letters = await cluster.wait_dead_letters(junk, timeout_s=60.0)
    assert len(letters) == junk  # every refusal kept, none twice
    assert max(len(d["payload"]) for d in letters) <= DEAD_LETTER_KEEP
    dlq = await js.stream_info(subjects.DEADLETTER_STREAM)
    assert dlq.state.bytes < junk * (DEAD_LETTER_KEEP + 1024)  # 18 MB of junk, kept in 1.5
    # The cluster still works for everyone else.
    await cluster.services.run_job("after-the-flood")


async def test_path_ids_and_unknown_models_hold_no_gpu(cluster: Cluster) -> None:
    nc = await connect("submitter", cluster.server, cluster.tls)
    start = time.monotonic()
    bad_ids = ["../../x", "/etc/passwd", "a/b", ".."]
    try:
        js = nc.jetstream()
        for job_id in bad_ids:
            body = {"job_id": job_id, "model": "cnn", "gpus": 1, "iterations": 5,
                    "iteration_time_s": 1.0}
            await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode())
        # As `nats pub` would, past `loom submit`'s check: no trainer runs this model.
        await js.publish(subjects.JOB_SUBMIT, json.dumps(
            {"job_id": "nomodel", "model": "no-such-model", "gpus": 1, "iterations": 5,
             "iteration_time_s": 1.0}
        ).encode())
    finally:
        await nc.close()
    letters = await cluster.wait_dead_letters(len(bad_ids))
    assert all("job_id" in d["reason"] for d in letters), letters
    failed = await cluster.services.wait_for("nomodel", "failed", timeout_s=LAUNCH_TIMEOUT_S)
    assert "no-such-model" in failed["reason"], failed
    assert time.monotonic() - start < LAUNCH_TIMEOUT_S
    jobs = await cluster.services.jobs()
    assert not set(bad_ids) & set(jobs)
    # Both GPUs are free: two one-GPU jobs run at once.
    await cluster.services.run_job("next-1")
    await cluster.services.run_job("next-2")
