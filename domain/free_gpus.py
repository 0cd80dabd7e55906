"""One cycle's free GPUs per node as bitmasks, and an index that finds the tightest node
with room for a gang (and the switches with enough whole nodes) without scanning every node."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from domain.compiled import mypyc_attr


def indices(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def lowest_bits(mask: int, k: int) -> int:
    """The k lowest set bits of mask."""
    out = 0
    while k and mask:
        bit = mask & -mask
        out |= bit
        mask ^= bit
        k -= 1
    return out


@mypyc_attr(allow_interpreted_subclasses=True)  # copyable: forecasts fork the state
@dataclass(slots=True)
class NodeGpus:
    """One node's GPUs as bitmasks: bit i set in `free` means GPU i is free this cycle."""

    node_id: str
    switch: str
    size: int
    free: int
    held: int  # held by a running job not yet re-placed this cycle
    gpu_type: str
    nvlink: tuple[int, ...] = ()  # per GPU: mask of its NVLink peers (empty: unknown)
    pos: int = 0  # in cluster order
    holders: dict[str, int] = field(default_factory=dict)  # running job → its GPUs' mask
    occupied: int = 0  # the union of the holders' masks

    @property
    def n_free(self) -> int:
        return self.free.bit_count()

    def unheld_free(self) -> int:
        return (self.free & ~self.held).bit_count()

    def available(self, displace: bool) -> int:
        """Free GPUs a new job may take: with `displace`, also those running jobs hold."""
        return self.n_free if displace else self.unheld_free()

    def take(self, k: int) -> tuple[int, ...]:
        """Take k free GPUs, unheld ones first, lowest index first (NVLink peers together,
        where the node agent reported its topology)."""
        unheld = self.free & ~self.held
        if self.nvlink and k > 1 and unheld.bit_count() >= k:
            picked = self._linked(unheld, k)
        else:
            picked = lowest_bits(unheld, k)
            short = k - picked.bit_count()
            if short:
                picked |= lowest_bits(self.free & self.held, short)
        self.free &= ~picked
        return indices(picked)

    def _linked(self, pool: int, k: int) -> int:
        """k GPUs of `pool`, grown greedily by NVLink links to those already taken."""
        def links(i: int, to: int) -> int:
            return (self.nvlink[i] & to).bit_count()

        members = indices(pool)
        first = max(members, key=lambda i: (links(i, pool), -i))
        picked = 1 << first
        while picked.bit_count() < k:
            rest = [i for i in members if not picked >> i & 1]
            picked |= 1 << max(rest, key=lambda i: (links(i, picked), -i))
        return picked


@mypyc_attr(allow_interpreted_subclasses=True)  # copyable: forecasts fork the state
class FreeIndex:
    """A pool's nodes filed by (free GPUs, free GPUs no running job holds), each file a heap of
    cluster positions, so the tightest (or first) node with room for a gang is found by looking
    at a few files rather than every node. Answers exactly as a scan in cluster order would.

    A node that moves is pushed onto its new file and left on the old one; entries that no
    longer match their node's file are dropped when they surface, and all files are rebuilt
    once stale entries outnumber the nodes (so moving costs a push, not a search).
    """

    def __init__(self, nodes: list[NodeGpus],
                 switches: Sequence[Sequence[NodeGpus]] = ()) -> None:
        """`switches`: the pool's nodes by switch, counted for wide gangs where every node
        is of one size (`whole`)."""
        self._top = top = max((n.size for n in nodes), default=0)
        self._files: dict[tuple[int, int], list[int]] = {}
        self._at: dict[int, tuple[int, int]] = {}
        self._entries = 0
        # Per switch, its whole nodes: every GPU free, and every GPU free and unheld.
        counted = bool(switches) and all(n.size == top for n in nodes)
        self._switch = {n.pos: i for i, group in enumerate(switches) for n in group}
        self._whole = [[0] * len(switches), [0] * len(switches)] if counted else None
        # Per switch, its free GPUs no running job holds, and all its free GPUs.
        self._sums = [[0] * len(switches), [0] * len(switches)] if switches else None
        for node in nodes:
            self.update(node)

    def update(self, node: NodeGpus) -> None:
        key = (node.free.bit_count(), (node.free & ~node.held).bit_count())
        old = self._at.get(node.pos)
        if old == key:
            return
        if self._whole is not None:
            i, top = self._switch[node.pos], self._top
            for d in (0, 1):  # unheld whole nodes, all whole nodes
                self._whole[d][i] += (key[1 - d] == top) - (old is not None and old[1 - d] == top)
        if self._sums is not None:
            i = self._switch[node.pos]
            self._sums[0][i] += key[1] - (old[1] if old is not None else 0)
            self._sums[1][i] += key[0] - (old[0] if old is not None else 0)
        self._at[node.pos] = key
        file = self._files.get(key)
        if file is None:
            file = self._files[key] = []
        heapq.heappush(file, node.pos)
        self._entries += 1
        if self._entries > 2 * len(self._at) + 64:
            self._rebuild()

    def fullest(self, displace: bool) -> Iterator[int]:
        """Positions of the nodes with GPUs a new job may take (`available`), the most first,
        ties in cluster order: what sorting every node would give, read from the files one
        level at a time (a spread reads the first few)."""
        side = 0 if displace else 1  # a file's key: (free GPUs, free GPUs no job holds)
        levels: dict[int, list[tuple[int, int]]] = {}
        for key in self._files:
            if key[side]:
                levels.setdefault(key[side], []).append(key)
        at = self._at
        for level in sorted(levels, reverse=True):
            yield from sorted({pos for key in levels[level] for pos in self._files[key]
                               if at[pos] == key})

    def switch_free(self, displace: bool) -> list[int] | None:
        """Per switch, in the order given, the GPUs a new job may take there (`available`);
        None where the index was not given switches."""
        return None if self._sums is None else self._sums[displace]

    def _rebuild(self) -> None:
        files: dict[tuple[int, int], list[int]] = {}
        for pos, key in self._at.items():
            files.setdefault(key, []).append(pos)
        for file in files.values():
            heapq.heapify(file)
        self._files, self._entries = files, len(self._at)

    def _first_in(self, key: tuple[int, int]) -> int | None:
        file = self._files.get(key)
        if not file:
            return None
        at = self._at
        while file and at[file[0]] != key:
            heapq.heappop(file)
            self._entries -= 1
        return file[0] if file else None

    def tightest(self, gpus: int, displace: bool) -> int | None:
        """The first node, in cluster order, of those with the fewest GPUs to take among those
        where `gpus` fit: free GPUs with `displace`, else free GPUs no running job holds (held
        ones go back to their jobs, so they do not count for the fit)."""
        top = self._top
        for room in range(gpus, top + 1):
            best: int | None = None
            for other in range(0 if displace else room, (room if displace else top) + 1):
                pos = self._first_in((room, other) if displace else (other, room))
                if pos is not None and (best is None or pos < best):
                    best = pos
            if best is not None:
                return best
        return None

    def first(self, gpus: int, displace: bool) -> int | None:
        """The first node, in cluster order, where `gpus` fit."""
        best: int | None = None
        for key in list(self._files):
            if (key[0] if displace else key[1]) >= gpus:
                pos = self._first_in(key)
                if pos is not None and (best is None or pos < best):
                    best = pos
        return best

    def whole(self, displace: bool) -> list[int] | None:
        """Per switch, how many nodes have every GPU free (with `displace`; else free and
        unheld); None where the pool's nodes differ in size."""
        return None if self._whole is None else self._whole[displace]

    def largest(self) -> int:
        return max((key[0] for key in list(self._files) if self._first_in(key) is not None),
                   default=0)


