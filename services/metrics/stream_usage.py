"""How full a live cluster's streams are: gauges for Prometheus, a warning near the limit.

The event stream refuses new messages once it holds `max_bytes` (`discard=new`, see
services/runtime/stream_limits.py), which stops the cluster; the metrics service's shell
polls each stream's info (`StreamWatch`) so that operators see it coming: the gauges
`loom_stream_bytes`, `loom_stream_max_bytes` and `loom_stream_messages` (labelled by
stream), and a warning when a stream crosses NEAR_FULL of its `max_bytes`, once per
crossing (`crossing`, a pure function: it warns again only after usage fell back below).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.runtime.logging import get_logger
from services.runtime.stream_limits import discard_name

NEAR_FULL = 0.8  # of max_bytes
POLL_S = 5.0

_log = get_logger("loom.metrics.streams")


@dataclass(frozen=True, slots=True)
class StreamUsage:
    stream: str
    bytes: int
    messages: int
    max_bytes: int  # -1 (or 0): no limit
    discard: str = "new"  # what the stream does when full: "new" refuses, "old" drops


def near_full(usage: StreamUsage, threshold: float = NEAR_FULL) -> bool:
    return usage.max_bytes > 0 and usage.bytes >= threshold * usage.max_bytes


def crossing(was_near: bool, usage: StreamUsage,
             threshold: float = NEAR_FULL) -> tuple[bool, bool]:
    """(near full now, warn now): warn when usage rises to the threshold, not while it stays
    there, and again after it fell below and rose once more."""
    near = near_full(usage, threshold)
    return near, near and not was_near


class StreamWatch:
    """Polls the streams' info every `every_s` (the thin shell around `crossing`); `latest`
    is what the Prometheus collector reads."""

    def __init__(self, js: Any, streams: Sequence[str], every_s: float = POLL_S) -> None:
        self.js = js
        self.streams = tuple(dict.fromkeys(streams))  # one stream may hold both
        self.every_s = every_s
        self.latest: dict[str, StreamUsage] = {}
        self._near: dict[str, bool] = {}
        self._failing: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> None:
        for stream in self.streams:
            try:
                info = await self.js.stream_info(stream)
            except Exception as exc:  # a server restart, say: try again next time
                if stream not in self._failing:
                    _log.warning("stream info unavailable", stream=stream,
                                 reason=f"{type(exc).__name__}: {exc}")
                self._failing.add(stream)
                continue
            self._failing.discard(stream)
            self.observe(StreamUsage(stream, int(info.state.bytes), int(info.state.messages),
                                     int(info.config.max_bytes or -1),
                                     discard_name(info.config.discard)))

    def observe(self, usage: StreamUsage) -> None:
        self.latest[usage.stream] = usage
        near, warn = crossing(self._near.get(usage.stream, False), usage)
        self._near[usage.stream] = near
        if warn:
            _log.warning("stream nearly full", stream=usage.stream, bytes=usage.bytes,
                         max_bytes=usage.max_bytes,
                         percent=round(100 * usage.bytes / usage.max_bytes, 1),
                         when_full=("refuses new messages: publishers fail"
                                    if usage.discard == "new" else "drops its oldest"))

    async def run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self.every_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="stream-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
