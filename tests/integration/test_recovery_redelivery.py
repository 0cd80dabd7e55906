"""Re-delivered node commands over a real nats-server never launch a job twice, even when
the node agent crashes and its durable consumer hands the commands back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from domain.overhead import parse_overhead
from schemas import subjects
from schemas.cluster import NodeSpec
from schemas.events import Envelope, JobFinished, Launch, NodeCommand, envelope
from services.nodeagent.simfleet import SimNodeCore
from services.runtime.clock import WallClock
from services.runtime.history import recover
from services.runtime.nats_live import NatsLiveBus
from services.runtime.natsserver import EmbeddedNats
from services.runtime.service import Shell
from tests.builders import make_job
from tests.integration.pipeline import Collector

pytestmark = pytest.mark.nats
NODE = NodeSpec(node_id="n0", switch_id="s0", gpus=4)


async def until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(poll(), timeout)


def command(job: str, cycle: int, event_id: str) -> Envelope:
    spec = make_job(job).iterations(10).iteration_time(0.05).build()  # half a second
    body = NodeCommand(node_id="n0", cycle=cycle, launches=(
        Launch(job_id=job, spec=spec, placement=(("n0", (0,)),)),))
    return envelope(body, event_id=event_id, occurred_at=time.time(), producer="placer",
                    causation_id=None)


async def start_agent(server: EmbeddedNats) -> tuple[NatsLiveBus, SimNodeCore]:
    """A node agent as `loom serve nodeagent` starts it: rebuild, then go live."""
    clock = WallClock()
    core = SimNodeCore(NODE, parse_overhead("none"))
    bus = await NatsLiveBus.connect(server.url, service=core.name, now=clock.now)
    recovered = await recover(core, bus, clock.now())
    shell = Shell(core, bus, clock, run_id=f"agent.{time.monotonic_ns()}")
    await shell.start()
    await shell.apply(recovered, None)
    await bus.flush()
    return bus, core


async def test_redelivered_and_rebound_commands_finish_a_job_once(
        nats_server: EmbeddedNats) -> None:
    placer = await NatsLiveBus.connect(nats_server.url, service="placer", now=time.time)
    audit = await NatsLiveBus.connect(nats_server.url, service="audit", now=time.time)
    finished = Collector()
    await audit.subscribe(subjects.JOB_FINISHED, finished, durable="audit")
    agent, core = await start_agent(nats_server)

    await placer.publish(subjects.node_command("n0"), command("a", 1, "placer.1"))
    await placer.publish(subjects.node_command("n0"), command("a", 1, "placer.1"))  # same id
    await placer.publish(subjects.node_command("n0"), command("a", 1, "placer2.1"))  # re-bound
    await placer.publish(subjects.node_command("n0"), command("b", 2, "placer.2"))
    await placer.flush()
    assert placer.stats.duplicates == 1  # JetStream's window caught only the same id
    await until(lambda: len(finished.got) >= 2)
    assert core.gate.dropped == 1

    # The agent dies without a goodbye (no drain, no acks in flight), then starts again: it
    # rebuilds from the stream and its consumer hands back what was not acknowledged.
    await agent.nc.close()
    again, core2 = await start_agent(nats_server)
    await placer.publish(subjects.node_command("n0"), command("a", 1, "placer3.1"))
    await placer.publish(subjects.node_command("n0"), command("c", 3, "placer.3"))
    await placer.flush()
    await until(lambda: len(finished.got) >= 3)
    await asyncio.sleep(0.8)  # a duplicate launch would finish within half a second

    done = [e.body.job_id for e in finished.got if isinstance(e.body, JobFinished)]
    assert sorted(done) == ["a", "b", "c"]
    assert core2.gate.finished >= {"a", "b"}
    for bus in (again, placer, audit):
        await bus.close()
