"""The bus interface every service talks through, and the in-memory virtual-time bus.

Both implementations (this one and `nats_bus.NatsSimBus`) promise the same semantics:
- `publish` of an envelope whose `event_id` was already published is dropped (JetStream's
  `Nats-Msg-Id` de-duplication) and returns False;
- deliveries happen in publish order, interleaved with timers by (time, priority, sequence);
- a payload that cannot be decoded is dead-lettered on `loom.deadletter.<durable>` with the
  reason (and its first `DEAD_LETTER_KEEP` bytes: `DeadLetter.kept`), and delivery goes on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from sortedcontainers import SortedDict

from schemas import subjects
from schemas.codec import CodecError, decode, decode_submission
from schemas.events import DeadLetter, Envelope, envelope
from services.runtime.effects import PRIORITY_INPUT
from services.runtime.kernel import SimKernel
from services.runtime.stream_limits import DUPLICATE_WINDOW_S

Handler = Callable[[Envelope], Awaitable[None]]
# Whether a subscriber wants an envelope at all: a cheap check the bus makes before delivering
# (a simulated node with nothing to account passes a cycle over).
Wants = Callable[[Envelope], bool]


class Interest:
    """A `Wants` that is a switch its subscriber flips as it comes to want, or stops wanting,
    what its subject carries. A bus in this process keeps only the subscribers whose switch is
    on, so a subscriber that is off costs nothing per message (a cycle reaches the nodes that
    run jobs, not all ten thousand)."""

    __slots__ = ("_watchers", "on")

    def __init__(self, on: bool = False) -> None:
        self.on = on
        self._watchers: list[Callable[[bool], None]] = []

    def __call__(self, env: Envelope) -> bool:
        return self.on

    def set(self, on: bool) -> None:
        if on is not self.on:
            self.on = on
            for watcher in self._watchers:
                watcher(on)

    def watch(self, watcher: Callable[[bool], None]) -> None:
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[bool], None]) -> None:
        self._watchers.remove(watcher)


MSG_ID = "Nats-Msg-Id"  # the NATS header JetStream de-duplicates by: Loom's event id


class Decoder(Protocol):
    def __call__(self, payload: bytes, *, fallback_id: str, now: float) -> Envelope: ...


def decode_any(payload: bytes, *, fallback_id: str, now: float) -> Envelope:
    return decode(payload)


def decode_submit(payload: bytes, *, fallback_id: str, now: float) -> Envelope:
    return decode_submission(payload, fallback_id=fallback_id, now=now, producer="submitter")


@dataclass
class BusStats:
    published: int = 0
    delivered: int = 0
    duplicates: int = 0
    dead_lettered: int = 0


class Bus(Protocol):
    stats: BusStats

    async def publish(self, subject: str, env: Envelope) -> bool: ...

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None = None) -> bool:
        ...

    async def subscribe(
        self, subject: str, handler: Handler, *, durable: str, decoder: Decoder = decode_any,
        wants: Wants | None = None,
    ) -> None:
        """Deliver what matches `subject` to `handler`; with `wants`, only the envelopes it
        accepts (the rest are passed over, as if handled with no effect)."""
        ...

    async def flush(self) -> None:
        """Until everything published so far is stored (a no-op where publishing is)."""
        ...

    async def close(self) -> None: ...


@dataclass
class Subscription:
    pattern: str
    durable: str
    handler: Handler
    decoder: Decoder
    wants: Wants | None = None

    def passes_over(self, env: Envelope) -> bool:
        """Whether this subscriber does not want `env` (see `Bus.subscribe`)."""
        return self.wants is not None and not self.wants(env)


class Route:
    """The subscriptions one subject reaches, in subscription order; one whose `wants` is an
    `Interest` only while that is on (the rest check their `wants` at delivery)."""

    def __init__(self, subs: list[Subscription]) -> None:
        self.subs = subs
        self._watching: list[tuple[Interest, Callable[[bool], None]]] = []
        gated = [(i, s.wants) for i, s in enumerate(subs) if isinstance(s.wants, Interest)]
        if not gated:
            self._open: SortedDict | None = None
            return
        self._open = SortedDict({i: s for i, s in enumerate(subs)
                                 if not isinstance(s.wants, Interest) or s.wants.on})
        for i, interest in gated:
            watcher = partial(self._flip, i)
            interest.watch(watcher)
            self._watching.append((interest, watcher))

    def __bool__(self) -> bool:
        return bool(self.subs)

    def targets(self) -> list[Subscription]:
        """Who may want a message now, in subscription order."""
        return self.subs if self._open is None else list(self._open.values())

    def _flip(self, i: int, on: bool) -> None:
        assert self._open is not None
        if on:
            self._open[i] = self.subs[i]
        else:
            self._open.pop(i, None)

    def close(self) -> None:
        for interest, watcher in self._watching:
            interest.unwatch(watcher)
        self._watching = []


@dataclass
class Routes:
    """Subject → route, cached: a run uses a handful of subjects millions of times. Literal
    patterns are looked up, not matched one by one (each of 10,000 nodes has its own)."""

    subs: list[Subscription] = field(default_factory=list)
    cache: dict[str, Route] = field(default_factory=dict)
    _literal: dict[str, list[int]] = field(default_factory=dict)  # subject → subscriptions
    _wild: list[int] = field(default_factory=list)

    def add(self, sub: Subscription) -> None:
        i = len(self.subs)
        self.subs.append(sub)
        if "*" in sub.pattern or ">" in sub.pattern:
            self._wild.append(i)
        else:
            self._literal.setdefault(sub.pattern, []).append(i)
        for route in self.cache.values():
            route.close()
        self.cache.clear()

    def match(self, subject: str) -> Route:
        hit = self.cache.get(subject)
        if hit is None:
            found = self._literal.get(subject, []) + [
                i for i in self._wild if subjects.matches(self.subs[i].pattern, subject)]
            hit = Route([self.subs[i] for i in sorted(found)])
            self.cache[subject] = hit
        return hit


def fallback_id(msg_id: str | None, sequence: int) -> str:
    """Event id for a payload that is not an envelope (e.g. `nats pub` JSON): the publisher's
    `Nats-Msg-Id` when it set one, else the message's sequence in the run's stream."""
    return msg_id if msg_id is not None else f"seq.{sequence}"


def decode_failure(exc: Exception) -> str:
    """The dead-letter reason for a payload a decoder refused (or choked on)."""
    return str(exc) if isinstance(exc, CodecError) else f"undecodable: {type(exc).__name__}: {exc}"


def dead_letter_envelope(
    sub: Subscription, subject: str, payload: bytes, reason: str, now: float, n: int
) -> Envelope:
    body = DeadLetter.kept(subject=subject, service=sub.durable, reason=reason, payload=payload)
    return envelope(
        body, event_id=f"dlq.{sub.durable}.{n}", occurred_at=now, producer="bus", causation_id=None
    )


class DuplicateWindow:
    """Event ids published in the last `window_s` (JetStream's de-duplication window, here in
    the kernel's virtual time): a repeat within it is a duplicate. Older ids are forgotten, so
    a run of millions of events keeps only a window's worth. Ids are kept by the instant they
    were published at, and forgotten an instant at a time, when the clock has moved."""

    def __init__(self, kernel: SimKernel, window_s: float = DUPLICATE_WINDOW_S) -> None:
        self.kernel = kernel
        self.window_s = window_s
        self._ids: set[str] = set()
        self._order: deque[tuple[float, list[str]]] = deque()  # oldest instant first
        self._at: float | None = None  # the instant `_order`'s last list holds
        self._batch: list[str] = []

    def first(self, event_id: str) -> bool:
        """Whether `event_id` is new within the window (it is remembered from now on)."""
        now = self.kernel.now
        if now != self._at:
            self._forget(now)
            self._at, self._batch = now, []
            self._order.append((now, self._batch))
        ids = self._ids
        if event_id in ids:
            return False
        ids.add(event_id)
        self._batch.append(event_id)
        return True

    def _forget(self, now: float) -> None:
        order, ids = self._order, self._ids
        while order and order[0][0] < now - self.window_s:
            for event_id in order.popleft()[1]:
                ids.discard(event_id)


class MemoryBus:
    """In-process bus on the virtual-time kernel; envelopes are delivered as objects."""

    def __init__(self, kernel: SimKernel) -> None:
        self.kernel = kernel
        self.stats = BusStats()
        self._routes = Routes()
        self._seen = DuplicateWindow(kernel)

    async def publish(self, subject: str, env: Envelope) -> bool:
        if not self._seen.first(env.event_id):
            self.stats.duplicates += 1
            return False
        self.stats.published += 1
        route = self._routes.match(subject)
        if route:
            self.kernel.push(self.kernel.now, PRIORITY_INPUT, partial(self._deliver, route, env))
        return True

    async def _deliver(self, route: Route, env: Envelope) -> None:
        for sub in route.targets():
            if sub.passes_over(env):
                continue
            self.stats.delivered += 1
            await sub.handler(env)

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None = None) -> bool:
        if msg_id is not None and not self._seen.first(msg_id):
            self.stats.duplicates += 1
            return False
        self.stats.published += 1
        fallback = fallback_id(msg_id, self.stats.published)
        route = self._routes.match(subject)
        if route:
            self.kernel.schedule(
                self.kernel.now,
                PRIORITY_INPUT,
                lambda: self._deliver_raw(route, subject, payload, fallback),
            )
        return True

    async def _deliver_raw(
        self, route: Route, subject: str, payload: bytes, fallback: str
    ) -> None:
        for sub in route.targets():
            try:
                env = sub.decoder(payload, fallback_id=fallback, now=self.kernel.now)
            except Exception as exc:  # any undecodable payload is dead-lettered, never fatal
                self.stats.dead_lettered += 1
                dl = dead_letter_envelope(
                    sub, subject, payload, decode_failure(exc), self.kernel.now,
                    self.stats.dead_lettered,
                )
                await self.publish(subjects.deadletter(sub.durable), dl)
                continue
            if sub.passes_over(env):
                continue
            self.stats.delivered += 1
            await sub.handler(env)

    async def subscribe(
        self, subject: str, handler: Handler, *, durable: str, decoder: Decoder = decode_any,
        wants: Wants | None = None,
    ) -> None:
        self._routes.add(Subscription(subject, durable, handler, decoder, wants))

    async def flush(self) -> None:
        return None  # delivery is in-process: nothing in flight

    async def close(self) -> None:
        return None
