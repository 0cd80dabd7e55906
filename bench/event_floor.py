"""The floor under a simulated event: what the kernel, the memory bus and the service shells
cost per message when the cores do no work at all.

A relay core's timer publishes a batch of messages one after the other; a sink core takes each
and returns nothing, as the metrics core does with a transition. So each event costs: the
envelope and its event id, the duplicate window, the route, the kernel's heap, the delivery
and the shell's call into the core. Run once with a body built once (the plumbing alone), once
with a transition body validated per message, as the scheduler builds them.

    .venv/bin/python bench/event_floor.py                # 200,000 events each way
    .venv/bin/python bench/event_floor.py --events 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
from collections.abc import Hashable, Sequence

from pydantic import BaseModel

from schemas import subjects
from schemas.causes import Cause
from schemas.events import Envelope, JobTransition
from schemas.job import JobState
from services.runtime.bus import MemoryBus
from services.runtime.clock import VirtualClock
from services.runtime.effects import Effect, Publish, SetTimer
from services.runtime.kernel import SimKernel
from services.runtime.service import CoreDefaults, Shell, Subscribe

BATCH = 16  # messages per timer, about a busy cycle's transitions


def transition(n: int) -> JobTransition:
    return JobTransition(job_id=f"job-{n}", state=JobState.RUNNING, previous=JobState.QUEUED,
                         cause="started", reason=Cause.from_v1("started", JobState.RUNNING),
                         gpus=1, placement=(("n0", (0,)),), iterations_done=float(n))


class Relay(CoreDefaults):
    """Publishes `events` transitions, `BATCH` per timer, one timer a second."""

    name = "relay"

    def __init__(self, events: int, fresh_bodies: bool) -> None:
        self.left = events
        self.fresh = fresh_bodies
        self.body = transition(0)

    def subscriptions(self) -> Sequence[Subscribe]:
        return ()

    def start(self, now: float) -> list[Effect]:
        return [SetTimer(key="tick", at=now)]

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        n = min(BATCH, self.left)
        self.left -= n
        bodies: list[BaseModel] = ([transition(self.left + i) for i in range(n)] if self.fresh
                                   else [self.body] * n)
        effects: list[Effect] = [Publish(subjects.JOB_TRANSITION, b) for b in bodies]
        if self.left:
            effects.append(SetTimer(key="tick", at=now + 1.0))
        return effects


class Sink(CoreDefaults):
    name = "sink"

    def __init__(self) -> None:
        self.seen = 0

    def subscriptions(self) -> Sequence[Subscribe]:
        return (Subscribe(subjects.JOB_TRANSITION),)

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        self.seen += 1
        return []


async def run(events: int, fresh_bodies: bool) -> tuple[float, int]:
    kernel = SimKernel()
    clock = VirtualClock(kernel)
    bus = MemoryBus(kernel)
    sink = Sink()
    shells = [Shell(Relay(events, fresh_bodies), bus, clock), Shell(sink, bus, clock)]
    for shell in reversed(shells):
        await shell.start()
    cpu = time.process_time()
    await kernel.run()
    return time.process_time() - cpu, sink.seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    args = ap.parse_args()
    print(f"# {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()}; {args.events:,} events each")
    print(f"{'bodies':<24} {'CPU s':>8} {'µs per event':>13}")
    for label, fresh in (("built once", False), ("validated per message", True)):
        cpu, seen = asyncio.run(run(args.events, fresh))
        assert seen == args.events, (seen, args.events)
        print(f"{label:<24} {cpu:>8.3f} {1e6 * cpu / seen:>13.2f}")


if __name__ == "__main__":
    main()
