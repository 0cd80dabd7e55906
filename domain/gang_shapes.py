"""The shapes a gang may take within a pool of nodes, for the schemes of `domain.placement`
that are not one node: whole nodes plus a remainder under one switch, an aligned buddy block,
or GPUs spread over the fullest nodes. Each takes the GPUs it returns (`NodeGpus.take`) and
reads `displace` as the placement does: False, only GPUs no running job holds; True, held
ones too."""

from __future__ import annotations

from collections.abc import Iterable

from domain.free_gpus import NodeGpus, indices
from schemas.events import GpuSlots


def multi_node(members: list[NodeGpus], gpus: int, displace: bool, *, first_fit: bool
               ) -> GpuSlots | None:
    """Whole free nodes of one switch (`members`) plus one node for the remainder; the
    remainder's node is the first that fits with `first_fit` (yarn), else the tightest."""
    size = max(n.size for n in members)
    if size == 0:
        return None
    full_needed, rest = divmod(gpus, size)
    every = (1 << size) - 1  # a whole node's mask (a smaller node never matches it)
    whole = ([n for n in members if n.free == every] if displace
             else [n for n in members if n.free & ~n.held == every])
    if len(whole) < full_needed:
        return None
    whole.sort(key=lambda n: n.unheld_free() < size)  # undisturbed nodes first
    chosen = whole[:full_needed]
    remainder = None
    if rest:
        candidates = [n for n in members if n not in chosen and n.available(displace) >= rest]
        if not candidates:
            return None
        remainder = candidates[0] if first_fit else min(
            candidates, key=lambda n: (n.unheld_free() < rest, n.available(displace)))
    slots = [(n.node_id, n.take(size)) for n in chosen]
    if remainder is not None:
        slots.append((remainder.node_id, remainder.take(rest)))
    return tuple(slots)


def buddy_block(switches: list[list[NodeGpus]], gpus: int, displace: bool) -> GpuSlots | None:
    """An aligned power-of-two block: GPUs [i·gpus, (i+1)·gpus) of the tightest node that has
    one, else whole nodes in a row (aligned) under one switch."""
    best: tuple[int, NodeGpus, int] | None = None  # (GPUs to take, node, block mask)
    for members in switches:
        for node in members:
            if node.size < gpus:
                continue
            usable = node.free if displace else node.free & ~node.held
            for start in range(0, node.size - gpus + 1, gpus):
                block = ((1 << gpus) - 1) << start
                if usable & block == block:
                    room = node.available(displace)
                    if best is None or room < best[0]:
                        best = (room, node, block)
                    break
    if best is not None:
        _, node, block = best
        node.free &= ~block
        return ((node.node_id, indices(block)),)
    for members in switches:
        size = max((n.size for n in members), default=0)
        if size == 0 or gpus % size:
            continue
        run = gpus // size
        for start in range(0, len(members) - run + 1, run):
            row = members[start:start + run]
            if all(n.size == size and n.available(displace) == size for n in row):
                return tuple((n.node_id, n.take(size)) for n in row)
    return None


def spread(nodes: list[NodeGpus], switches: list[list[NodeGpus]], gpus: int, displace: bool,
           sums: list[int] | None = None,
           fullest: Iterable[NodeGpus] | None = None) -> GpuSlots | None:
    """Fewest nodes: the nodes with the most available GPUs, of one switch if one has enough
    (the first fullest), else of the whole pool (`nodes`, every node of `switches`).
    `sums`: each switch's available GPUs, and `fullest`: the pool's nodes with any, most
    first (ties in pool order, read only if the whole pool is needed), where an index keeps
    them (else they are read)."""
    if sums is None:
        sums = [sum(n.available(displace) for n in group) for group in switches]
    best_at = max(range(len(switches)), key=sums.__getitem__)
    best, in_best = switches[best_at], sums[best_at]
    if in_best < gpus and sum(sums) < gpus:
        return None
    order: Iterable[NodeGpus]
    if in_best < gpus and fullest is not None:
        order = fullest
    else:  # a stable sort: ties stay in pool order
        order = sorted(best if in_best >= gpus else nodes,
                       key=lambda n: -n.available(displace))
    need = gpus
    slots: list[tuple[str, tuple[int, ...]]] = []
    for node in order:
        k = min(need, node.available(displace))
        if k:
            slots.append((node.node_id, node.take(k)))
            need -= k
        if need == 0:
            break
    return tuple(slots)
