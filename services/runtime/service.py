"""The thin shell around a core: subscribe, call the core, publish what it returns.

A shell owns everything a core must not do: I/O, numbering events, timers and dead-lettering.
An exception from the core on one message is dead-lettered with its reason; the service goes on.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from domain.compiled import mypyc_attr
from schemas import subjects
from schemas.codec import encode
from schemas.events import DeadLetter, Envelope, envelope
from services.runtime.bus import Bus, Decoder, Wants, decode_any
from services.runtime.clock import Clock, TimerHandle
from services.runtime.effects import (
    CancelTimer,
    Effect,
    Publish,
    ReserveOrder,
    SetTimer,
    SetTimers,
)
from services.runtime.logging import get_logger


class RetryLater(Exception):
    """An input that may succeed once other messages have arrived: on a live cluster each
    subscription is its own consumer, so a message can overtake one it depends on. A bus
    that redelivers (`redelivers = True`) retries it shortly and dead-letters it only if it
    keeps failing for minutes; elsewhere it is dead-lettered at once, like any core error."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    subject: str
    decoder: Decoder = decode_any
    wants: Wants | None = None  # see `Bus.subscribe`


@dataclass(frozen=True, slots=True)
class Recorded:
    """One message of the event stream, with its stream sequence number (a rebuild's input)."""

    seq: int
    subject: str
    env: Envelope


class Core(Protocol):
    """A deterministic state machine: inputs are envelopes and timer keys, plus the time."""

    name: str

    def subscriptions(self) -> Sequence[Subscribe]: ...

    def start(self, now: float) -> list[Effect]: ...

    def handle(self, env: Envelope, now: float) -> list[Effect]: ...

    def on_timer(self, key: Hashable, now: float) -> list[Effect]: ...

    def history_subjects(self) -> Sequence[str]:
        """What the core rebuilds its state from after a restart (empty: it does not)."""
        ...

    def rebuild(self, history: Sequence[Recorded], now: float) -> list[Effect]:
        """Restore the state from `history` (those subjects' messages, in stream order);
        returns what to publish and arm on going live."""
        ...

    def state(self, now: float) -> dict[str, Any]:
        """What operators and `loom status` read from the running service."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)  # cores defined outside the build
class CoreDefaults:
    """What most cores do: nothing at start or on timers, no rebuild (mix in and override as
    needed)."""

    name: str

    def start(self, now: float) -> list[Effect]:
        return []

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        raise KeyError(f"{type(self).__name__} set no timer {key!r}")

    def history_subjects(self) -> Sequence[str]:
        return ()

    def rebuild(self, history: Sequence[Recorded], now: float) -> list[Effect]:
        return []

    def state(self, now: float) -> dict[str, Any]:
        # Looked up as on any object: a core outside the compiled build names itself in its
        # class, which this compiled base's own `name` slot would hide.
        return {"now": now, "service": getattr(self, "name")}  # noqa: B009


@mypyc_attr(allow_interpreted_subclasses=True)  # the node agent's and the leader's
class Shell:
    def __init__(self, core: Core, bus: Bus, clock: Clock, *, run_id: str = "run") -> None:
        self.core = core
        self.bus = bus
        self.clock = clock
        self.name = core.name
        self._run_id = run_id
        self._numbered: dict[str, int] = {}  # producer → the events it has numbered
        self._timers: dict[Hashable, TimerHandle] = {}
        self._reserved = 0  # the place before the block of order its core last reserved
        self.log = get_logger(f"loom.{core.name}")
        self.errors = 0

    async def start(self) -> None:
        for sub in self.core.subscriptions():
            await self.bus.subscribe(
                sub.subject, self._on_message, durable=self.name, decoder=sub.decoder,
                wants=sub.wants,
            )
        await self.apply(self.core.start(self.clock.now()), None)

    async def _on_message(self, env: Envelope) -> None:
        try:
            effects = self.core.handle(env, self.clock.now())
        except RetryLater as retry:  # (names differ: mypyc types one name per function)
            if getattr(self.bus, "redelivers", False):
                raise  # the bus hands it back shortly (see RetryLater)
            await self._dead_letter(env, f"{type(retry).__name__}: {retry}")
            return
        except Exception as exc:  # a bug or bad input must not stop the service
            await self._dead_letter(env, f"{type(exc).__name__}: {exc}")
            return
        await self.apply(effects, env.event_id)

    async def _dead_letter(self, env: Envelope, reason: str) -> None:
        """Keep the message and why it failed (publish first: nothing may stop that)."""
        self.errors += 1
        body = DeadLetter.kept(subject=env.type, service=self.name, reason=reason,
                               payload=encode(env))
        await self.bus.publish(subjects.deadletter(self.name), self._wrap(body, None, env.event_id))
        self._log("error", "message dead-lettered", event_type=env.type, event_id=env.event_id,
                  reason=reason, trace=traceback.format_exc(limit=3))

    def _log(self, level: str, event: str, **fields: object) -> None:
        with contextlib.suppress(Exception):  # a broken log sink must never stop a service
            getattr(self.log, level)(event, **fields)

    def _wrap(self, body: object, event_id: str | None, cause: str | None,
              producer: str | None = None) -> Envelope:
        name = self.name if producer is None else producer
        if event_id is None:
            n = self._numbered[name] = self._numbered.get(name, 0) + 1
            event_id = f"{self._run_id}.{name}.{n}"
        return envelope(
            body,  # type: ignore[arg-type]
            event_id=event_id,
            occurred_at=self.clock.now(),
            producer=name,
            causation_id=cause,
        )

    async def apply(self, effects: list[Effect], cause: str | None) -> None:
        for eff in effects:
            if type(eff) is Publish:
                await self.bus.publish(eff.subject, self._wrap(eff.body, eff.event_id, cause,
                                                                  eff.producer))
            elif type(eff) is SetTimer:
                if eff.order is None:
                    self._set_timers(((eff.key, eff.at),), eff.priority)
                else:
                    self._set_in_place(eff)
            elif type(eff) is SetTimers:
                self._set_timers(eff.timers, eff.priority)
            elif type(eff) is ReserveOrder:
                self._reserved = self.clock.reserve(eff.count)
            elif type(eff) is CancelTimer:
                old = self._timers.pop(eff.key, None)
                if old is not None:
                    old.cancel()
            else:
                raise TypeError(f"unknown effect {eff!r}")

    def _set_in_place(self, eff: SetTimer) -> None:
        """A timer in a place of the block last reserved (`SetTimer.order`)."""
        assert eff.order is not None
        old = self._timers.pop(eff.key, None)
        if old is not None:
            old.cancel()
        self._timers[eff.key] = self.clock.call_at(
            eff.at, eff.priority, partial(self._fire, eff.key), self._reserved + 1 + eff.order)

    def _set_timers(self, pairs: Iterable[tuple[Hashable, float]], priority: int) -> None:
        """Arm each (key, at) in order; an armed key's timer moves, with its callback."""
        timers, clock = self._timers, self.clock
        move = clock.move
        for key, at in pairs:
            old = timers.get(key)
            if old is None:
                timers[key] = clock.call_at(at, priority, partial(self._fire, key))
            else:
                timers[key] = move(old, at, priority)

    async def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        try:
            effects = self.core.on_timer(key, self.clock.now())
        except Exception:
            self.errors += 1
            self._log("error", "timer failed", key=str(key), trace=traceback.format_exc(limit=3))
            return
        await self.apply(effects, None)
        try:
            await self.bus.flush()  # a message's effects are flushed before it is acknowledged
        except Exception as exc:
            self.errors += 1
            self._log("error", "publishes of a timer not stored", key=str(key),
                      reason=f"{type(exc).__name__}: {exc}")
