"""Pollux's GPU counts packed onto nodes, repairing what does not fit.

Jobs that keep their GPU count keep their GPUs; distributed jobs get whole nodes plus one
remainder node no other distributed job uses (at most one distributed job per node, to avoid
network interference); the rest best fit. A job that cannot be packed drops to its next
smaller count until all fit (`settle`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.pollux.optimiser import MAX_NODES, JobTerms, job_value, shape_nodes
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots


@dataclass
class Nodes:
    """Free GPUs per node and which nodes host a part of a distributed job (one cycle)."""

    ids: list[str]
    size: list[int]
    free: list[int]
    distributed: list[bool]

    @classmethod
    def of(cls, cluster: ClusterSpec) -> Nodes:
        sizes = [n.gpus for n in cluster.nodes]
        return cls([n.node_id for n in cluster.nodes], sizes, list(sizes),
                   [False] * len(sizes))

    def copy(self) -> Nodes:
        return Nodes(self.ids, self.size, list(self.free), list(self.distributed))

    def take(self, slots: GpuSlots, index: Mapping[str, int]) -> None:
        spread = len(slots) > 1
        for node_id, gpus in slots:
            i = index[node_id]
            self.free[i] -= len(gpus)
            self.distributed[i] = self.distributed[i] or spread

    def choose(self, gpus: int) -> list[tuple[int, int]] | None:
        """(node, GPUs) for a new job: one node, best fit, if any node is big enough; else
        whole empty nodes plus one remainder node hosting no distributed job."""
        if gpus <= max(self.size):
            fits = [i for i in range(len(self.free)) if self.free[i] >= gpus]
            if not fits:
                return None
            i = min(fits, key=lambda k: (self.free[k], k))
            return [(i, gpus)]
        empty = sorted((i for i in range(len(self.free))
                        if self.free[i] == self.size[i] > 0 and not self.distributed[i]),
                       key=lambda k: (-self.size[k], k))
        parts: list[tuple[int, int]] = []
        need = gpus
        for i in empty:
            if need >= self.size[i]:
                parts.append((i, self.size[i]))
                need -= self.size[i]
            if need == 0:
                break
        if need:
            used = {i for i, _ in parts}
            # Prefer a partly used node for the remainder: keeps empty nodes whole.
            rest = [i for i in range(len(self.free)) if i not in used
                    and not self.distributed[i] and self.free[i] >= need]
            if not rest:
                return None
            i = min(rest, key=lambda k: (self.free[k] == self.size[k], self.free[k], k))
            parts.append((i, need))
        if len(parts) > MAX_NODES:
            return None
        return parts

    def commit(self, parts: list[tuple[int, int]]) -> None:
        for i, k in parts:
            self.free[i] -= k
            self.distributed[i] = self.distributed[i] or len(parts) > 1


def pack(order: Sequence[str], counts: Mapping[str, int], keep: Mapping[str, GpuSlots],
         nodes: Nodes, index: Mapping[str, int]) -> tuple[dict[str, list[tuple[int, int]]],
                                                         list[str]]:
    """Place GPU counts on nodes: kept jobs where they are, then the others, distributed
    first, largest first. Returns the placements and the jobs that did not fit."""
    placed: dict[str, list[tuple[int, int]]] = {}
    for jid in order:
        if jid in keep:
            nodes.take(keep[jid], index)
            placed[jid] = [(index[n], len(g)) for n, g in keep[jid]]
    largest = max(nodes.size)
    rest = [j for j in order if j not in keep and counts.get(j, 0) > 0]
    rest.sort(key=lambda j: (counts[j] <= largest, -counts[j]))  # stable: order breaks ties
    failed = []
    for jid in rest:
        parts = nodes.choose(counts[jid])
        if parts is None:
            failed.append(jid)
            continue
        nodes.commit(parts)
        placed[jid] = parts
    return placed, failed


def kept(current: Mapping[str, GpuSlots], counts: Mapping[str, int]) -> dict[str, GpuSlots]:
    """Running jobs whose GPU count stays: they keep their GPUs (no restart)."""
    return {j: slots for j, slots in current.items()
            if counts.get(j, 0) == sum(len(g) for _, g in slots)}


def settle(terms: Sequence[JobTerms], counts: Sequence[int], nodes: Nodes,
           current: Mapping[str, GpuSlots], index: Mapping[str, int], scale: float
           ) -> tuple[dict[str, list[tuple[int, int]]], int]:
    """Pack the optimiser's counts onto nodes, repairing what does not fit.

    While some job cannot be placed, one job steps down to its next smaller count (possibly
    0): the step that leaves fewest jobs unplaced, then costs the objective least. Once
    everything fits, GPUs left over go, one step at a time, to the job whose next larger count
    improves the objective most and still packs. Returns (job → [(node, GPUs)], steps down).
    """
    by_id = {t.job_id: t for t in terms}
    want = {t.job_id: c for t, c in zip(terms, counts, strict=True)}
    order = [t.job_id for t in terms]
    node_gpus = max(nodes.size)
    total = sum(nodes.size)

    def value(jid: str, c: int) -> float:
        t = by_id[jid]
        return job_value(t, c, shape_nodes(c, node_gpus), scale, c != t.current)

    def attempt(trial: Mapping[str, int]) -> tuple[dict[str, list[tuple[int, int]]], list[str]]:
        return pack(order, trial, kept(current, trial), nodes.copy(), index)

    drops = 0
    placed, failed = attempt(want)
    while failed:
        best: tuple[tuple[int, float], str, int] | None = None
        for jid in order:
            if want[jid] == 0:
                continue
            smaller = [c for c in by_id[jid].counts if c < want[jid]]
            c = smaller[-1] if smaller else 0
            trial = dict(want)
            trial[jid] = c
            _, still = attempt(trial)
            key = (len(still), value(jid, c) - value(jid, want[jid]))
            if best is None or key < best[0]:
                best = (key, jid, c)
        assert best is not None
        want[best[1]] = best[2]
        drops += 1
        placed, failed = attempt(want)
    if drops:  # fill what the repair freed
        while True:
            free = total - sum(want.values())
            steps = []
            for jid in order:
                larger = [c for c in by_id[jid].counts if want[jid] < c <= want[jid] + free]
                if larger:
                    c = larger[0]
                    gain = value(jid, want[jid]) - value(jid, c)
                    if gain > 0:
                        steps.append((-gain / (c - want[jid]), jid, c))
            for _, jid, c in sorted(steps):
                trial = dict(want)
                trial[jid] = c
                trial_placed, still = attempt(trial)
                if not still:
                    want, placed = trial, trial_placed
                    break
            else:
                break
    return placed, drops
