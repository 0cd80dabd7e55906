"""Clocks: time is an input. Virtual (simulation) and wall (live) behave the same to callers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from services.runtime.kernel import Entry, SimKernel

Callback = Callable[[], Coroutine[Any, Any, None]]


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def call_at(self, when: float, priority: int, callback: Callback,
                seq: int | None = None) -> TimerHandle:
        """Call back at `when`; `seq`: a place `reserve` handed out (kept where time
        orders same-instant work: virtual time)."""
        ...

    def move(self, handle: TimerHandle, when: float, priority: int) -> TimerHandle:
        """Re-time a pending timer, with its callback (as if cancelled and set again)."""
        ...

    def reserve(self, count: int) -> int:
        """The last place before `count` places reserved in the order of same-instant
        work (0 where nothing orders it: wall time)."""
        ...


class VirtualClock:
    """Time advances only when the kernel pops the next entry."""

    def __init__(self, kernel: SimKernel) -> None:
        self.kernel = kernel

    def now(self) -> float:
        return self.kernel.now

    def call_at(self, when: float, priority: int, callback: Callback,
                seq: int | None = None) -> Entry:
        return self.kernel.schedule(max(when, self.kernel.now), priority, callback, seq)

    def reserve(self, count: int) -> int:
        return self.kernel.reserve(count)

    def move(self, handle: TimerHandle, when: float, priority: int) -> TimerHandle:
        assert type(handle) is Entry
        kernel = self.kernel
        now = kernel.now
        # `max(when, now)` without the call: a node re-arms its runs at every cycle.
        return kernel.reschedule(handle, now if now > when else when, priority)


class _WallTimer:
    def __init__(self, handle: asyncio.TimerHandle, callback: Callback) -> None:
        self._handle = handle
        self.callback = callback  # what a move sets again

    def cancel(self) -> None:
        self._handle.cancel()


class WallClock:
    """Unix time, or `epoch` + (seconds since `origin`) × `scale`.

    Services of one time-scaled cluster share `epoch` and `origin` (a Unix time), so they
    agree on the time whenever each of them started.
    """

    def __init__(self, epoch: float | None = None, scale: float = 1.0,
                 origin: float | None = None) -> None:
        if scale <= 0:
            raise ValueError(f"time scale must be positive, not {scale}")
        self._t0 = time.time() if origin is None else origin
        self._epoch = self._t0 if epoch is None else epoch
        self._scale = scale

    def now(self) -> float:
        return self._epoch + (time.time() - self._t0) * self._scale

    def reserve(self, count: int) -> int:
        return 0  # the event loop runs due callbacks in the order they became due

    def call_at(self, when: float, priority: int, callback: Callback,
                seq: int | None = None) -> _WallTimer:
        loop = asyncio.get_running_loop()
        delay = max(0.0, (when - self.now()) / self._scale)
        handle = loop.call_later(delay, lambda: loop.create_task(callback()))
        return _WallTimer(handle, callback)

    def move(self, handle: TimerHandle, when: float, priority: int) -> TimerHandle:
        assert isinstance(handle, _WallTimer)
        handle.cancel()
        return self.call_at(when, priority, handle.callback)
