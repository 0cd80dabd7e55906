"""A simulation sets Python's cyclic collector for its run and puts it back after."""

from __future__ import annotations

import gc
import weakref

import pytest

from loom.simulate import _collector_tuned


def test_a_run_collects_rarely_and_leaves_the_collector_as_it_found_it() -> None:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        with _collector_tuned():
            assert gc.get_threshold() == (5_000_000, 10, 10)
            assert gc.get_freeze_count() > 0  # what existed at the start is out of reach
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == 0
    finally:
        gc.set_threshold(*before)


def test_what_a_run_made_joins_the_oldest_generation_without_a_collection() -> None:
    # Restoring the young threshold would make the next allocation walk everything the run
    # left young: up to 5,000,000 objects.
    started: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        with _collector_tuned():
            made = [[i] for i in range(20_000)]
            gc.callbacks.append(seen)
        try:
            oldest = {id(o) for o in gc.get_objects(generation=2)}
        finally:
            gc.callbacks.remove(seen)
    finally:
        gc.set_threshold(*before)
    assert started == []
    assert all(id(m) in oldest for m in made)


def test_a_run_that_fails_still_gives_the_collector_back() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), _collector_tuned():
        raise RuntimeError("the run broke")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_old_garbage_frozen_for_a_run_is_freed_after_it() -> None:
    # The run collects only the young generations before it freezes the heap: a cycle that
    # was already old is frozen with the rest, and must come back to the collector after.
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    gone = weakref.ref(a)
    gc.collect()  # both survive into the oldest generation
    del a, b  # old garbage now
    with _collector_tuned():
        assert gone() is not None  # frozen, not collected
    gc.collect()
    assert gone() is None
