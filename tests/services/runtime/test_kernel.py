from __future__ import annotations

import pytest

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
