from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime.kernel import SimKernel


async def test_runs_by_time_then_priority_then_schedule_order() -> None:
    k = SimKernel()
    seen: list[str] = []

    def rec(name: str):  # type: ignore[no-untyped-def]
        async def act() -> None:
            seen.append(f"{name}@{k.now:g}")
        return act

    k.schedule(5, 0, rec("late"))
    k.schedule(1, 10, rec("low-prio"))
    k.schedule(1, 0, rec("first"))
    k.schedule(1, 0, rec("second"))
    k.push(1, 5, rec("pushed"))
    await k.run()
    assert seen == ["first@1", "second@1", "pushed@1", "low-prio@1", "late@5"]


async def test_work_scheduled_now_runs_before_later_priorities_at_the_same_instant() -> None:
    k = SimKernel()
    seen: list[str] = []

    async def cycle() -> None:
        seen.append("cycle")

    async def arrival() -> None:
        seen.append("arrival")

        async def message() -> None:
            seen.append("message")

        k.push(k.now, 0, message)

    k.schedule(3, 10, cycle)
    k.schedule(3, 0, arrival)
    await k.run()
    assert seen == ["arrival", "message", "cycle"]


async def test_cancelled_entries_are_skipped_and_time_never_goes_back() -> None:
    k = SimKernel()
    seen: list[float] = []

    async def act() -> None:
        seen.append(k.now)

    k.schedule(2, 0, act).cancel()
    k.schedule(4, 0, act)
    await k.run()
    assert seen == [4]
    with pytest.raises(ValueError, match="past"):
        k.schedule(1, 0, act)


async def test_run_until_stops_before_later_work() -> None:
    k = SimKernel()
    seen: list[float] = []

    async def act() -> None:
        seen.append(k.now)

    for t in (1, 2, 3):
        k.schedule(t, 0, act)
    await k.run(until=2)
    assert seen == [1, 2] and k.pending == 1


async def test_work_pushed_for_now_waits_for_work_reserved_ahead_of_it() -> None:
    """A delivery pushed for the current instant runs after work the heap holds for that
    instant and priority with an earlier sequence (reserved, then scheduled), and before
    later priorities."""
    k = SimKernel()
    seen: list[str] = []

    def rec(name: str):  # type: ignore[no-untyped-def]
        async def act() -> None:
            seen.append(name)
        return act

    async def start() -> None:
        base = k.reserve(1)
        k.push(k.now, 0, rec("pushed"))
        k.schedule(k.now, 0, rec("reserved"), seq=base + 1)
        k.schedule(k.now, 10, rec("cycle"))

    k.schedule(1, 0, start)
    await k.run()
    assert seen == ["reserved", "pushed", "cycle"]


async def test_run_until_leaves_pushed_work_pending() -> None:
    k = SimKernel()

    async def act() -> None:
        return None

    k.schedule(3, 0, act)
    await k.run(until=2)
    k.push(k.now, 0, act)
    assert k.pending == 2


def test_nothing_is_scheduled_ahead_of_the_first_priority() -> None:
    k = SimKernel()

    async def act() -> None:
        return None

    with pytest.raises(ValueError, match="priority -1"):
        k.schedule(1, -1, act)
    with pytest.raises(ValueError, match="priority -1"):
        k.push(1, -1, act)


# A scripted action: when it runs, what it schedules (delay, priority, how: "push", "timer",
# "reserved" for a place reserved then scheduled after a push, "moved" for a timer moved later).
_Spawn = tuple[int, int, str]
_script = st.lists(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 0, 10]),
                                      st.sampled_from(["push", "timer", "reserved", "moved"])),
                            max_size=3), min_size=1, max_size=40)


@given(_script)
@settings(max_examples=150, deadline=None)
def test_the_kernel_runs_work_in_order_of_time_priority_and_sequence(
        script: list[list[_Spawn]]) -> None:
    """Against a model that keeps every piece of work in one sorted list: the same script
    runs in the same order (the queue beside the heap changes no order)."""
    assert _run_kernel(script) == _run_model(script)


def _run_kernel(script: list[list[_Spawn]]) -> list[int]:
    k = SimKernel()
    ran: list[int] = []
    count = iter(range(1, 10**6))

    def action(n: int):  # type: ignore[no-untyped-def]
        async def act() -> None:
            ran.append(n)
            for delay, priority, how in script[n % len(script)] if n < 200 else []:
                child = action(next(count))
                if how == "push" and delay == 0 and priority == 0:
                    k.push(k.now, 0, child)
                elif how == "reserved":
                    base = k.reserve(1)
                    k.push(k.now, 0, action(next(count)))
                    k.schedule(k.now + delay, priority, child, seq=base + 1)
                elif how == "moved":
                    entry = k.schedule(k.now, priority, child)
                    k.reschedule(entry, k.now + delay, priority)
                else:
                    k.schedule(k.now + delay, priority, child)
        return act

    k.schedule(0, 0, action(0))
    asyncio.run(k.run())
    return ran


def _run_model(script: list[list[_Spawn]]) -> list[int]:
    pending: list[tuple[float, int, int, int]] = [(0, 0, 1, 0)]  # time, priority, seq, n
    seq, now, ran = 1, 0.0, []
    count = iter(range(1, 10**6))
    while pending:
        pending.sort()
        now, _, _, n = pending.pop(0)
        ran.append(n)
        for delay, priority, how in script[n % len(script)] if n < 200 else []:
            child = next(count)
            if how == "reserved":
                seq += 1
                reserved = seq
                seq += 1
                pending.append((now, 0, seq, next(count)))
                pending.append((now + delay, priority, reserved, child))
            elif how == "moved":
                seq += 2  # its first place, then the one it moves to
                pending.append((now + delay, priority, seq, child))
            else:
                seq += 1
                pending.append((now + delay, priority, seq, child))
    return ran
