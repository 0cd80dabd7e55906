"""Virtual time: one heap of work ordered by (time, priority, sequence), SimPy-style.

Timers and bus deliveries share the heap, so everything that happens at one instant happens in
a fixed order: by priority, then in the order it was scheduled. Given the same inputs a run
makes the same decisions, bit for bit.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Action = Callable[[], Awaitable[None]]


@dataclass(order=True, slots=True)
class Entry:
    time: float
    priority: int
    seq: int
    action: Action | None = field(compare=False)

    def cancel(self) -> None:
        self.action = None


class SimKernel:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[Entry] = []
        self._seq = 0
        self.steps = 0

    def schedule(self, when: float, priority: int, action: Action) -> Entry:
        if when < self.now:
            raise ValueError(f"cannot schedule in the past: {when} < now {self.now}")
        self._seq += 1
        entry = Entry(when, priority, self._seq, action)
        heapq.heappush(self._heap, entry)
        return entry

    @property
    def pending(self) -> int:
        return len(self._heap)

    async def run(
        self,
        until: float | None = None,
        progress: Callable[[], None] | None = None,
        every: int = 4096,
    ) -> None:
        heap = self._heap
        while heap:
            if progress is not None and self.steps % every == 0:
                progress()
            if until is not None and heap[0].time > until:
                break
            entry = heapq.heappop(heap)
            action = entry.action
            if action is None:
                continue
            self.now = entry.time
            self.steps += 1
            await action()
