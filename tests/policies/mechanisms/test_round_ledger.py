"""Gavel's round bookkeeping in columns (`RoundLedger`), driven without a policy: rows keep the
order combinations were added in, and each row's numbers follow it through removals and
compactions."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.mechanisms import round_ledger
from policies.mechanisms.round_ledger import UNKNOWN, Combo, RoundLedger


def ledger_of(*combos: Combo, types: tuple[str, ...] = ("v100", "k80"),
              received: float = 180.0) -> RoundLedger:
    ledger = RoundLedger()
    ledger.ensure_types(types, received)
    for combo in combos:
        ledger.add(combo, gpus=len(combo))
    ledger.fill_unset(received)
    return ledger


def order(ledger: RoundLedger) -> list[Combo]:
    return [ledger.combo_at(r) for r in ledger.live_rows().tolist()]


@pytest.mark.parametrize(("steps", "expected"), [
    pytest.param([("add", ("a",)), ("add", ("b",))], [("a",), ("b",)], id="added-in-order"),
    pytest.param([("add", ("a",)), ("add", ("b",)), ("add", ("a",))], [("a",), ("b",)],
                 id="added-again-keeps-its-place"),
    pytest.param([("add", ("a",)), ("add", ("b",)), ("remove", "a"), ("add", ("a",))],
                 [("b",), ("a",)], id="removed-then-added-goes-last"),
    pytest.param([("add", ("a",)), ("add", ("b",)), ("add", ("a", "b")), ("remove", "b")],
                 [("a",)], id="removing-a-job-removes-its-pairs"),
    pytest.param([("add", ("a",)), ("remove", "z")], [("a",)], id="removing-unknown-is-no-op"),
])
def test_rows_keep_the_order_combinations_were_added_in(
        steps: list[tuple[str, object]], expected: list[Combo]) -> None:
    ledger = ledger_of()
    for op, arg in steps:
        if op == "add":
            assert isinstance(arg, tuple)
            ledger.add(arg, gpus=1)
        else:
            assert isinstance(arg, str)
            ledger.remove_job(arg)
    assert order(ledger) == expected
    assert ledger.singles == {c[0] for c in expected if len(c) == 1}
    assert len(ledger) == len(expected)


def test_a_row_added_again_starts_over_but_keeps_its_allocation() -> None:
    ledger = ledger_of(("a",), ("b",))
    ledger.set_allocation([("a",), ("b",)], ("k80", "v100"), np.array([[0.5, 0.25], [0, 0]]))
    a = ledger.row[("a",)]
    ledger.received[a] += 40.0
    ledger.deficit[a] = 7.0
    ledger.add(("a",), gpus=1)
    ledger.fill_unset(180.0)
    assert ledger.received[a].tolist() == [180.0, 180.0]
    assert ledger.deficit[a].tolist() == [0.0, 0.0]
    assert ledger.alloc[a, ledger.col["k80"]] == 0.5
    assert ledger.alloc[a, ledger.col["v100"]] == 0.25


@pytest.mark.parametrize(("x", "unallocated"), [
    pytest.param([[0.0, 0.0], [1.0, 0.0]], {"a": True, "b": False, "c": False},
                 id="zero-row-is-unallocated"),
    pytest.param([[0.0, 0.3], [0.0, 0.0]], {"a": False, "b": True, "c": False},
                 id="any-share-is-allocated"),
])
def test_unallocated_means_an_entry_of_zeros(x: list[list[float]],
                                             unallocated: dict[str, bool]) -> None:
    # c was never part of an allocation: it has no entry at all, so it is not "unallocated".
    ledger = ledger_of(("a",), ("b",), ("c",))
    ledger.set_allocation([("a",), ("b",)], ("k80", "v100"), np.array(x))
    assert {j: ledger.unallocated((j,)) for j in "abc"} == unallocated


def test_an_allocation_replaces_the_last_one() -> None:
    ledger = ledger_of(("a",), ("b",))
    ledger.set_allocation([("a",), ("b",)], ("k80", "v100"), np.ones((2, 2)))
    ledger.set_allocation([("b",)], ("k80", "v100"), np.array([[0.5, 0.5]]))
    assert ledger.alloc[ledger.row[("a",)]].tolist() == [0.0, 0.0]
    assert not ledger.unallocated(("a",)) and not ledger.allocated[ledger.row[("a",)]]


def test_a_new_type_gives_every_row_its_starting_time_and_nothing_else() -> None:
    ledger = ledger_of(("a",), ("b",), types=("k80",))
    ledger.deficit[:, 0] = 3.0
    ledger.ensure_types(("k80", "p100"), 180.0)
    p100 = ledger.col["p100"]
    rows = ledger.live_rows()
    assert ledger.received[rows, p100].tolist() == [180.0, 180.0]
    assert ledger.deficit[rows, p100].tolist() == [0.0, 0.0]
    assert ledger.alloc[rows, p100].tolist() == [0.0, 0.0]
    assert (ledger.runs[rows, p100] == UNKNOWN).all()
    assert ledger.deficit[rows, ledger.col["k80"]].tolist() == [3.0, 3.0]


def test_seen_in_needs_every_job_of_a_combination() -> None:
    ledger = ledger_of(("a",), ("b",), ("a", "b"))
    assert ledger.seen_in(ledger.row[("a", "b")], {"a", "b"})
    assert not ledger.seen_in(ledger.row[("a", "b")], {"a"})


def test_a_removed_row_is_not_read() -> None:
    ledger = ledger_of(("a",), ("b",))
    row = ledger.row[("a",)]
    ledger.remove_job("a")
    with pytest.raises(KeyError, match="removed"):
        ledger.combo_at(row)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add later", "remove", "fill"]),
                          st.integers(0, 4)), min_size=8, max_size=100),
       st.integers(1, 8))
def test_rows_follow_their_combination_through_compactions(
        steps: list[tuple[str, int]], compact_from: int) -> None:
    """Against a plain dict: the same live combinations in the same order, each row still
    holding the numbers written for its combination, however many rows were compacted away
    (compactions made frequent), and rows added for the next round to set still set by it."""
    with patch.object(round_ledger, "_COMPACT_FROM", compact_from):
        check_against_a_dict(steps)


def check_against_a_dict(steps: list[tuple[str, int]]) -> None:
    ledger = ledger_of()
    truth: dict[Combo, float] = {}  # a key assigned again keeps its place, as a row does
    unset: set[Combo] = set()
    for n, (op, k) in enumerate(steps):
        combo: Combo = (f"j{k}",)
        if op == "add":
            ledger.add(combo, gpus=k + 1, received=float(n))
            truth[combo] = float(n)
        elif op == "add later":
            ledger.add(combo, gpus=k + 1)
            truth[combo] = truth.get(combo, 0.0)
            if combo not in unset:  # a row still in an earlier row's place: that value
                ledger.received[ledger.row[combo]] = truth[combo]
            unset.add(combo)
        elif op == "remove":
            ledger.remove_job(combo[0])
            truth.pop(combo, None)
            unset.discard(combo)
        else:
            ledger.fill_unset(float(n))
            truth.update(dict.fromkeys(unset, float(n)))
            unset.clear()
        dead = len(ledger.combos) - len(ledger)
        assert dead < max(round_ledger._COMPACT_FROM, len(ledger))
    assert order(ledger) == list(truth)
    for combo, received in truth.items():
        row = ledger.row[combo]
        if combo not in unset:
            assert ledger.received[row].tolist() == [received, received]
        assert ledger.size_of(combo) == int(combo[0][1:]) + 1
