"""The cluster as placement sees it between cycles: nodes, switches, NVLink peers, GPUs out
of service, and placements as per-node GPU bitmasks."""

from __future__ import annotations

import functools
from collections.abc import Collection

from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots


@functools.cache
def gpu_mask(gpus: tuple[int, ...]) -> int:
    m = 0
    for i in gpus:
        m |= 1 << i
    return m



class Topology:
    """What does not change between cycles: node sizes, switches, and placements as bitmasks.

    Build it once per cluster and pass it to every `CyclePlacement`; converting a job's GPU
    list to per-node masks is memoised, since running jobs keep the same placement for many
    cycles.
    """

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.nodes = [(n.node_id, n.switch_id, n.gpus, n.gpu_type) for n in cluster.nodes]
        self.index = {n.node_id: i for i, n in enumerate(cluster.nodes)}
        self.type_of = {n.node_id: n.gpu_type for n in cluster.nodes}
        groups: dict[str, list[int]] = {}
        for i, n in enumerate(cluster.nodes):
            groups.setdefault(n.switch_id, []).append(i)
        self.switch_groups = list(groups.values())
        # NVLink peers per GPU, per node, as node agents report them (`learn_links`).
        self.nvlink: dict[str, tuple[int, ...]] = {}
        self.links_learned = 0  # how many times links were learned (placements refresh theirs)
        sizes = {n.gpus for n in cluster.nodes if n.gpus}
        self.uniform = len(sizes) <= 1
        self.total_gpus = cluster.total_gpus
        self._masks: dict[GpuSlots, tuple[tuple[int, int], ...] | None] = {}
        # GPUs out of service, per node as a mask (`take_out`): nothing new lands on them.
        self.out: dict[str, int] = {}

    def learn_links(self, node_id: str, pairs: Collection[tuple[int, int]]) -> None:
        """A node's NVLink-connected GPU pairs (by index): placement keeps gangs on them."""
        i = self.index.get(node_id)
        if i is None:
            return
        peers = [0] * self.nodes[i][2]
        for a, b in pairs:
            if a < len(peers) and b < len(peers):
                peers[a] |= 1 << b
                peers[b] |= 1 << a
        self.nvlink[node_id] = tuple(peers) if any(peers) else ()
        self.links_learned += 1

    def take_out(self, node_id: str, gpus: Collection[int]) -> None:
        """Take these GPUs of a node out of service (a failed health check), and its others
        back in: like a drained node, one GPU at a time, a job running on one keeps it and
        nothing new is placed there."""
        i = self.index.get(node_id)
        if i is None:
            return
        mask = 0
        for g in gpus:
            if 0 <= g < self.nodes[i][2]:
                mask |= 1 << g
        if mask:
            self.out[node_id] = mask
        else:
            self.out.pop(node_id, None)

    def masks(self, slots: GpuSlots) -> tuple[tuple[int, int], ...] | None:
        """(node index, GPU mask) per node of a placement; None if it names missing GPUs."""
        hit = self._masks.get(slots, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        out: list[tuple[int, int]] | None = []
        for node_id, gpus in slots:
            i = self.index.get(node_id)
            m = gpu_mask(gpus)
            if i is None or m >> self.nodes[i][2]:
                out = None
                break
            out.append((i, m))  # type: ignore[union-attr]
        result = None if out is None else tuple(out)
        self._masks[slots] = result
        return result


