"""Virtual time: one heap of work ordered by (time, priority, sequence), SimPy-style.

Timers and bus deliveries share one order, so everything that happens at one instant happens in
a fixed order: by priority, then in the order it was scheduled. Given the same inputs a run
makes the same decisions, bit for bit. Work pushed for the current instant at the first
priority (bus deliveries, most of a run's work) waits in a queue beside the heap rather than
in it: nothing can be scheduled before now or ahead of that priority, so that queue is already
in order, and the kernel takes the smaller of its head and the heap's.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Awaitable, Callable

Action = Callable[[], Awaitable[None]]

FIRST_PRIORITY = 0  # no work may be scheduled ahead of it (see the module's docstring)


class Entry:
    """A scheduled action; `cancel()` makes the kernel skip it."""

    __slots__ = ("action", "priority", "seq", "time")

    def __init__(self, time: float, priority: int, seq: int, action: Action) -> None:
        self.time = time
        self.priority = priority
        self.seq = seq
        self.action: Action | None = action

    def cancel(self) -> None:
        self.action = None


class SimKernel:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        # Plain tuples so heap comparisons stay in C: (time, priority, seq, entry or action).
        self._heap: list[tuple[float, int, int, Entry | Action]] = []
        # Pushed for `now` at the first priority, in sequence order: (sequence, action).
        self._lane: deque[tuple[int, Action]] = deque()
        self._seq = 0
        self.steps = 0

    def schedule(self, when: float, priority: int, action: Action,
                 seq: int | None = None) -> Entry:
        """Run `action` at `when`, after the work of that instant and priority scheduled
        before it; with `seq` (one `reserve` handed out), in the place it reserved."""
        _check(when, priority, self.now)
        if seq is None:
            self._seq += 1
            seq = self._seq
        entry = Entry(when, priority, seq, action)
        heapq.heappush(self._heap, (when, priority, seq, entry))
        return entry

    def reserve(self, count: int) -> int:
        """Hand out the next `count` places in the order (the sequence numbers `count`
        schedules made now would take): those after the returned number."""
        base = self._seq
        self._seq += count
        return base

    def reschedule(self, entry: Entry, when: float, priority: int) -> Entry:
        """Move a pending entry; it then runs exactly as a freshly scheduled one would.

        Moving later is lazy: the entry takes its new (time, priority, sequence) now and is
        re-pushed when its old place in the heap comes up, so a timer that is pushed back at
        every cycle costs O(1) per move instead of a heap push and a dead entry.
        """
        if entry.action is None or when < entry.time or priority != entry.priority:
            action = entry.action
            entry.cancel()
            assert action is not None, "cannot reschedule a cancelled entry"
            return self.schedule(when, priority, action)
        self._seq += 1
        entry.time, entry.seq = when, self._seq
        return entry

    def push(self, when: float, priority: int, action: Action) -> None:
        """Like `schedule`, for work that is never cancelled (bus deliveries): no Entry."""
        _check(when, priority, self.now)
        self._seq += 1
        if when == self.now and priority == FIRST_PRIORITY:
            self._lane.append((self._seq, action))
        else:
            heapq.heappush(self._heap, (when, priority, self._seq, action))

    @property
    def pending(self) -> int:
        return len(self._heap) + len(self._lane)

    async def run(
        self,
        until: float | None = None,
        progress: Callable[[], None] | None = None,
        every: int = 4096,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Run until nothing is left, `until` is passed, or `stop()` (checked between events)
        says so."""
        heap, lane = self._heap, self._lane
        pop, push = heapq.heappop, heapq.heappush
        while heap or lane:
            if progress is not None and self.steps % every == 0:
                progress()
            if stop is not None and stop():
                break
            if lane:
                # The lane's head is (now, FIRST_PRIORITY, its sequence): only work the heap
                # holds for now, at that priority, with an earlier (reserved) sequence is ahead.
                top = heap[0] if heap else None
                if (top is None or top[0] != self.now or top[1] != FIRST_PRIORITY
                        or top[2] > lane[0][0]):
                    if until is not None and self.now > until:
                        break
                    self.steps += 1
                    await lane.popleft()[1]()
                    continue
            if until is not None and heap[0][0] > until:
                break
            when, _, seq, item = pop(heap)
            if type(item) is Entry:
                if item.action is None:
                    continue  # cancelled
                if item.seq != seq:  # moved: take its new place in the order
                    push(heap, (item.time, item.priority, item.seq, item))
                    continue
                action: Action = item.action
            else:
                action = item  # type: ignore[assignment]
            self.now = when
            self.steps += 1
            await action()


def _check(when: float, priority: int, now: float) -> None:
    if when < now:
        raise ValueError(f"cannot schedule in the past: {when} < now {now}")
    if priority < FIRST_PRIORITY:
        raise ValueError(f"priority {priority} is ahead of the first, {FIRST_PRIORITY}")
