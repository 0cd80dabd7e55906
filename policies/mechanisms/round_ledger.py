"""Gavel's round bookkeeping as columns: one row per combination, one column per GPU type.

Per combination (a job alone, or a pair sharing GPUs), in the order it was added: the seconds
it received on each type since the last reset, its deficit, its allocation X and whether it
makes progress on each type. A round ranks every combination on a type from whole columns, so
its cost per waiting job is numpy's, not a dict walk's (`policies.mechanisms.rounds`).

Removed rows stay in place (so the order of the rest is kept) until they outnumber the live
ones, then the table is compacted in order.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

import numpy as np

from policies.mechanisms.lp import FloatArray, IntArray

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
Combo = tuple[str, ...]  # one job, or two jobs sharing GPUs (in admission order)

UNKNOWN, NO, YES = -1, 0, 1  # whether a combination makes progress on a type
_COMPACT_FROM = 64  # dead rows below this never trigger a compaction


class RoundLedger:
    """Received time, deficits, allocations and runnability of every combination by type."""

    def __init__(self) -> None:
        self.types: list[str] = []
        self.col: dict[str, int] = {}
        self.combos: list[Combo | None] = []  # by row; None once removed
        self.row: dict[Combo, int] = {}
        self.singles: set[str] = set()  # jobs with a row of their own
        self._of_job: dict[str, list[Combo]] = {}  # job → the combinations holding it
        self._unset: list[int] = []  # rows whose received time the next round sets
        self.received = np.zeros((0, 0))
        self.deficit = np.zeros((0, 0))
        self.alloc = np.zeros((0, 0))
        self.allocated = np.zeros(0, np.bool_)  # has an allocation since the last reset
        self.runs = np.zeros((0, 0), np.int8)
        self.gpus = np.zeros(0, np.int64)
        self.alive = np.zeros(0, np.bool_)

    def __len__(self) -> int:
        return len(self.row)

    def __contains__(self, combo: object) -> bool:
        return combo in self.row

    # -- rows ----------------------------------------------------------------------------------
    def add(self, combo: Combo, gpus: int, received: float | None = None) -> None:
        """A combination with nothing owed: its received time `received` on every type, or, by
        default, whatever the next round sets (`fill_unset`). Adding one that is there starts
        its received time and deficit again where it stands (its allocation is kept)."""
        row = self.row.get(combo)
        if row is None:
            row = len(self.combos)
            self._grow(row + 1)
            self.combos.append(combo)
            self.row[combo] = row
            self.alive[row] = True
            self.gpus[row] = gpus
            self.runs[row] = UNKNOWN
            for jid in combo:
                self._of_job.setdefault(jid, []).append(combo)
            if len(combo) == 1:
                self.singles.add(combo[0])
        self.deficit[row] = 0.0
        if received is None:
            self._unset.append(row)
        else:
            self.received[row] = received

    def fill_unset(self, received: float) -> None:
        """Give the rows added since the last round their starting received time."""
        if self._unset:
            self.received[self._unset] = received
            self._unset = []

    def remove_job(self, job_id: str) -> None:
        """Drop every combination holding `job_id`."""
        for combo in self._of_job.pop(job_id, []):
            row = self.row.pop(combo, None)
            if row is None:
                continue
            self.combos[row] = None
            self.alive[row] = False
            for other in combo:
                if other != job_id and other in self._of_job:
                    self._of_job[other].remove(combo)
        self.singles.discard(job_id)
        if len(self.combos) - len(self.row) >= max(_COMPACT_FROM, len(self.row)):
            self._compact()

    def size_of(self, combo: Combo) -> int:
        """GPUs the combination takes (its first job's gang)."""
        return int(self.gpus[self.row[combo]])

    def combo_at(self, row: int) -> Combo:
        combo = self.combos[row]
        if combo is None:
            raise KeyError(f"row {row} of the round ledger was removed")
        return combo

    def seen_in(self, row: int, jobs: Container[str]) -> bool:
        """Whether every job of the combination at `row` is in `jobs`."""
        return all(j in jobs for j in self.combo_at(row))

    def live_rows(self) -> IntArray:
        """Rows of the live combinations, in the order they were added."""
        out: IntArray = np.flatnonzero(self.alive[:len(self.combos)])
        return out

    # -- columns -------------------------------------------------------------------------------
    def ensure_types(self, types: Iterable[str], received: float) -> None:
        """A column for each type not seen before: every row has `received` on it, no
        deficit, no allocation, its runnability unknown."""
        new = [t for t in types if t not in self.col]
        if not new:
            return
        for t in new:
            self.col[t] = len(self.types)
            self.types.append(t)
        k, rows = len(new), self.received.shape[0]
        self.received = np.hstack([self.received, np.full((rows, k), received)])
        self.deficit = np.hstack([self.deficit, np.zeros((rows, k))])
        self.alloc = np.hstack([self.alloc, np.zeros((rows, k))])
        self.runs = np.hstack([self.runs, np.full((rows, k), UNKNOWN, np.int8)])

    def cols(self, types: Sequence[str]) -> IntArray:
        return np.array([self.col[t] for t in types], np.int64)

    def set_allocation(self, combos: Sequence[Combo], types: Sequence[str],
                       x: FloatArray) -> None:
        """X for `combos` (rows of x) on `types` (its columns); every other row has none."""
        self.alloc[:] = 0.0
        self.allocated[:] = False
        rows = np.array([self.row[c] for c in combos], np.int64)
        self.alloc[np.ix_(rows, self.cols(types))] = x
        self.allocated[rows] = True

    def unallocated(self, combo: Combo) -> bool:
        """Whether the last allocation gave `combo` an entry, all of it zero."""
        row = self.row.get(combo)
        return row is not None and bool(self.allocated[row]) and not self.alloc[row].any()

    # -- storage -------------------------------------------------------------------------------
    def _grow(self, rows: int) -> None:
        have = self.received.shape[0]
        if rows <= have:
            return
        cap = max(rows, 2 * have, 16)
        extra = cap - have
        width = len(self.types)
        self.received = np.vstack([self.received, np.zeros((extra, width))])
        self.deficit = np.vstack([self.deficit, np.zeros((extra, width))])
        self.alloc = np.vstack([self.alloc, np.zeros((extra, width))])
        self.runs = np.vstack([self.runs, np.full((extra, width), UNKNOWN, np.int8)])
        self.allocated = np.concatenate([self.allocated, np.zeros(extra, np.bool_)])
        self.gpus = np.concatenate([self.gpus, np.zeros(extra, np.int64)])
        self.alive = np.concatenate([self.alive, np.zeros(extra, np.bool_)])

    def _compact(self) -> None:
        keep = self.live_rows()
        self.received, self.deficit = self.received[keep], self.deficit[keep]
        self.alloc, self.runs = self.alloc[keep], self.runs[keep]
        self.allocated, self.gpus = self.allocated[keep], self.gpus[keep]
        self.alive = self.alive[keep]
        moved = {int(old): new for new, old in enumerate(keep.tolist())}
        self._unset = [moved[r] for r in self._unset if r in moved]
        self.combos = [self.combos[r] for r in keep.tolist()]
        self.row = {c: i for i, c in enumerate(self.combos) if c is not None}
