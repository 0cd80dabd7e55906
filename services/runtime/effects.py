"""What a core asks its shell to do. Cores return these; they never perform I/O themselves."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from domain.compiled import mypyc_attr
from services.runtime.kernel import FIRST_PRIORITY

# Ordering of work that happens at the same virtual instant (lower runs first). Inputs take the
# kernel's first priority: its deliveries for the current instant then skip the heap.
PRIORITY_INPUT = FIRST_PRIORITY  # messages, arrivals, completions
PRIORITY_CYCLE = 10  # a scheduling cycle runs after every input at that instant


# The effects cores make for every message spell out `__init__` (`init=False`): mypyc compiles
# a written one, while the one `dataclass` generates stays interpreted (a tenth of the speed).
# Written with `object.__setattr__`, it keeps them frozen when run from source.
@dataclass(frozen=True, slots=True, init=False)
class Publish:
    subject: str
    body: BaseModel
    event_id: str | None  # None: the shell numbers it; set it to make a publish idempotent
    # None: the core's name. A core that carries several producers' state machines (a fleet
    # of simulated nodes) publishes each one's messages under its own name and numbering.
    producer: str | None

    def __init__(self, subject: str, body: BaseModel, event_id: str | None = None,
                 producer: str | None = None) -> None:
        object.__setattr__(self, "subject", subject)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "event_id", event_id)
        object.__setattr__(self, "producer", producer)


@dataclass(frozen=True, slots=True, init=False)
class SetTimer:
    """Fire `on_timer(key)` at `at`; setting an existing key moves that timer.

    With `order`: the timer takes the `order`-th place (from 0) of the block its core last
    reserved (`ReserveOrder`) among work at the same instant and priority, as if set when the
    block was reserved. A core that re-arms lazily what it would have re-armed then (a node
    at each cycle) keeps the order the eager re-arms had."""

    key: Hashable
    at: float
    priority: int
    order: int | None

    def __init__(self, key: Hashable, at: float, priority: int = PRIORITY_INPUT,
                 order: int | None = None) -> None:
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "order", order)


@dataclass(frozen=True, slots=True)
class ReserveOrder:
    """Reserve the next `count` places in the order of same-instant work (each timer set
    takes one): the places `count` timers set now would take, for `SetTimer.order` later."""

    count: int


# Not frozen: every node makes one at every cycle, and a frozen __init__ costs three times more.
@dataclass(slots=True)
class SetTimers:
    """`SetTimer`s of one priority, set in order: one effect where a core re-arms many timers
    at once (a node at every cycle), instead of an effect for each."""

    timers: Sequence[tuple[Hashable, float]]  # (key, at)
    priority: int = PRIORITY_INPUT


@dataclass(frozen=True, slots=True, init=False)
class CancelTimer:
    key: Hashable

    def __init__(self, key: Hashable) -> None:
        object.__setattr__(self, "key", key)


@mypyc_attr(allow_interpreted_subclasses=True)  # the node agent's own effects
@dataclass(frozen=True, slots=True)
class LocalEffect:
    """Base of effects only one kind of shell carries out (the node agent's process control);
    any other shell refuses them."""


Effect = Publish | SetTimer | SetTimers | ReserveOrder | CancelTimer | LocalEffect
