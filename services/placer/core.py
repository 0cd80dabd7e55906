"""Placement of gangs onto switches → nodes → GPUs, one scheduling cycle at a time.

`CyclePlacement` starts from an empty cluster and places jobs in the order the policy walks
them, all-or-nothing. Two schemes:

- `consolidated` (Muri/Tiresias "yarn"): a job that fits in one node gets one node; a bigger job
  gets whole free nodes plus one node for the remainder, all under one switch.
- `count`: only the number of free GPUs matters (Tiresias' dlas path); GPUs are still chosen
  consolidated when possible, else from as few nodes as possible.

Running jobs keep their GPUs when those are still free ("sticky"), and new jobs prefer GPUs no
running job holds, so a re-plan moves as few jobs as possible. Both schemes are monotone: if a
gang of g GPUs does not fit, no bigger gang fits either, which lets policies skip ahead.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots

Scheme = Literal["consolidated", "count"]
SCHEMES: tuple[Scheme, ...] = ("consolidated", "count")


@functools.cache
def _mask(gpus: tuple[int, ...]) -> int:
    m = 0
    for i in gpus:
        m |= 1 << i
    return m


def _indices(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def _lowest(mask: int, k: int) -> int:
    """The k lowest set bits of mask."""
    out = 0
    while k and mask:
        bit = mask & -mask
        out |= bit
        mask ^= bit
        k -= 1
    return out


@dataclass(slots=True)
class _Node:
    """One node's GPUs as bitmasks: bit i set in `free` means GPU i is free this cycle."""

    node_id: str
    switch: str
    size: int
    free: int
    held: int  # held by a running job not yet re-placed this cycle

    @property
    def n_free(self) -> int:
        return self.free.bit_count()

    def unheld_free(self) -> int:
        return (self.free & ~self.held).bit_count()

    def take(self, k: int) -> tuple[int, ...]:
        """Take k free GPUs, unheld ones first, lowest index first."""
        picked = _lowest(self.free & ~self.held, k)
        short = k - picked.bit_count()
        if short:
            picked |= _lowest(self.free & self.held, short)
        self.free &= ~picked
        return _indices(picked)


class CyclePlacement:
    """Free-GPU state of one cycle; `try_place` reserves a gang or returns None."""

    def __init__(
        self,
        cluster: ClusterSpec,
        scheme: Scheme = "consolidated",
        previous: Mapping[str, GpuSlots] | None = None,
    ) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown placement scheme {scheme!r}; known: {', '.join(SCHEMES)}")
        self.scheme = scheme
        self._nodes = [
            _Node(n.node_id, n.switch_id, n.gpus, (1 << n.gpus) - 1, 0) for n in cluster.nodes
        ]
        self._by_id = {n.node_id: n for n in self._nodes}
        self._switches: dict[str, list[_Node]] = {}
        for n in self._nodes:
            self._switches.setdefault(n.switch, []).append(n)
        self.free_gpus = cluster.total_gpus
        self._previous = dict(previous or {})
        # Each running job's GPUs as (node, mask), or None if they no longer exist.
        self._held: dict[str, list[tuple[_Node, int]] | None] = {}
        for job_id, slots in self._previous.items():
            held = [(self._by_id.get(node_id), _mask(gpus)) for node_id, gpus in slots]
            valid = [(n, m) for n, m in held if n is not None and not m >> n.size]
            if len(valid) == len(held):
                for node, m in valid:
                    node.held |= m
            self._held[job_id] = valid if len(valid) == len(held) else None
        self.placed: dict[str, GpuSlots] = {}
        self.monotone = True

    # -- queries used for "why is my job pending" ------------------------------------------
    def largest_block(self) -> int:
        return max((n.n_free for n in self._nodes), default=0)

    def explain(self, gpus: int) -> str:
        if gpus > self.free_gpus:
            return f"needs {gpus} GPUs, {self.free_gpus} free"
        return (
            f"needs {gpus} GPUs placed together; {self.free_gpus} free but the largest block "
            f"in one node is {self.largest_block()}"
        )

    # -- placement -------------------------------------------------------------------------
    def try_place(self, job_id: str, gpus: int) -> GpuSlots | None:
        if gpus > self.free_gpus or gpus <= 0:
            return None
        slots = self._keep(job_id, gpus) or self._consolidated(gpus)
        if slots is None and self.scheme == "count":
            slots = self._spread(gpus)
        if slots is not None:
            self.free_gpus -= gpus
            self.placed[job_id] = slots
        return slots

    def _keep(self, job_id: str, gpus: int) -> GpuSlots | None:
        """Give a running job back its own GPUs if they are all still free."""
        if job_id not in self._held:
            return None
        held = self._held.pop(job_id)
        if held is None:
            return None
        for node, m in held:
            node.held &= ~m  # no longer reserved for it, whatever happens next
        if sum(m.bit_count() for _, m in held) != gpus:
            return None
        if any(node.free & m != m for node, m in held):
            return None
        for node, m in held:
            node.free &= ~m
        return self._previous[job_id]

    def _consolidated(self, gpus: int) -> GpuSlots | None:
        single = [n for n in self._nodes if n.size >= gpus]
        if single:
            fits = [n for n in single if n.n_free >= gpus]
            if not fits:
                return None
            # Prefer nodes where no running job is displaced, then the tightest fit.
            best = min(fits, key=lambda n: (n.unheld_free() < gpus, n.n_free))
            return ((best.node_id, best.take(gpus)),)
        for members in self._switches.values():
            slots = self._multi_node(members, gpus)
            if slots is not None:
                return slots
        return None

    def _multi_node(self, members: list[_Node], gpus: int) -> GpuSlots | None:
        """Whole free nodes plus one node for the remainder, all in one switch."""
        size = max(n.size for n in members)
        full_needed, rest = divmod(gpus, size)
        whole = [n for n in members if n.size == size and n.n_free == size]
        whole.sort(key=lambda n: n.unheld_free() < size)
        if len(whole) < full_needed:
            return None
        chosen = whole[:full_needed]
        remainder = None
        if rest:
            candidates = [n for n in members if n not in chosen and n.n_free >= rest]
            if not candidates:
                return None
            remainder = min(candidates, key=lambda n: (n.unheld_free() < rest, n.n_free))
        slots = [(n.node_id, n.take(size)) for n in chosen]
        if remainder is not None:
            slots.append((remainder.node_id, remainder.take(rest)))
        return tuple(slots)

    def _spread(self, gpus: int) -> GpuSlots | None:
        """Fewest nodes: take from the nodes with the most free GPUs, one switch if possible."""
        groups = sorted(
            self._switches.values(), key=lambda ms: -sum(n.n_free for n in ms)
        )
        pool = groups[0] if sum(n.n_free for n in groups[0]) >= gpus else self._nodes
        need = gpus
        slots: list[tuple[str, tuple[int, ...]]] = []
        for node in sorted(pool, key=lambda n: (-n.n_free, n.unheld_free() == 0)):
            if need == 0:
                break
            k = min(need, node.n_free)
            if k:
                slots.append((node.node_id, node.take(k)))
                need -= k
        return tuple(slots) if need == 0 else None
