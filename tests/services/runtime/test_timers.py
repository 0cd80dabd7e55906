"""The shell's timers: set, moved (with the callback they were set with) and set in batches."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence

from schemas.events import Envelope
from services.runtime.bus import MemoryBus
from services.runtime.clock import VirtualClock, WallClock
from services.runtime.effects import PRIORITY_INPUT, CancelTimer, Effect, SetTimer, SetTimers
from services.runtime.kernel import SimKernel
from services.runtime.service import CoreDefaults, Shell, Subscribe


class Timers(CoreDefaults):
    """Arms what it is given at start and records what fires."""

    name = "timers"

    def __init__(self, effects: list[Effect]) -> None:
        self.effects = effects
        self.fired: list[tuple[Hashable, float]] = []

    def subscriptions(self) -> Sequence[Subscribe]:
        return ()

    def start(self, now: float) -> list[Effect]:
        return self.effects

    def handle(self, env: Envelope, now: float) -> list[Effect]:
        return []

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        self.fired.append((key, now))
        return []


async def _run(effects: list[Effect]) -> tuple[list[tuple[Hashable, float]], int]:
    """What fires, and how many sequence numbers the kernel used."""
    kernel = SimKernel()
    core = Timers(effects)
    await Shell(core, MemoryBus(kernel), VirtualClock(kernel)).start()
    await kernel.run()
    return core.fired, kernel._seq


async def test_a_batch_sets_and_moves_timers_exactly_as_the_same_timers_one_by_one() -> None:
    first = [SetTimer("a", 5.0), SetTimer("b", 5.0), SetTimer("c", 9.0), SetTimer("x", 1.0)]
    moves: list[tuple[Hashable, float]] = [("b", 5.0), ("a", 7.0), ("c", 2.0), ("d", 5.0)]
    batched = await _run([*first, SetTimers(moves, PRIORITY_INPUT), CancelTimer("x")])
    single = await _run([*first, *(SetTimer(k, at) for k, at in moves), CancelTimer("x")])
    # Moved later (b, a), earlier (c), set anew (d); same-time timers in the order last set.
    assert batched == single == ([("c", 2.0), ("b", 5.0), ("d", 5.0), ("a", 7.0)], 8)


async def test_a_virtual_timer_set_in_the_past_fires_now() -> None:
    fired, _ = await _run([SetTimer("a", 4.0), SetTimers([("a", -1.0)])])
    assert fired == [("a", 0.0)]


async def test_a_moved_wall_timer_keeps_its_callback() -> None:
    clock = WallClock()
    fired: list[str] = []

    async def callback() -> None:
        fired.append("fired")

    handle = clock.call_at(clock.now() + 60.0, PRIORITY_INPUT, callback)
    clock.move(handle, clock.now(), PRIORITY_INPUT)
    for _ in range(50):
        if fired:
            break
        await asyncio.sleep(0.01)
    assert fired == ["fired"]
