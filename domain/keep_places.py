"""A running job that a cycle leaves on the same nodes with as many GPUs on each keeps its own
GPU indices, so it does not restart for a renumbering.

A walk that re-places running jobs may hand a job's GPUs to a gang placed before it and give
the job others on the same node: the same resources, but new `CUDA_VISIBLE_DEVICES`, so a
stop and a relaunch. Where a node's GPUs are interchangeable (no NVLink islands learned, none
out of service, no alignment as buddy blocks have), the GPUs the cycle uses on that node can
be dealt out again among the jobs it placed there: each such job gets its old indices back,
and the others take what is left, their own first. Each node keeps the same GPUs in use and
each job the same count on each of its nodes, so nothing the walk decided changes but which
index is whose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import islice

from domain.topology import Topology
from schemas.events import GpuSlots

# Schemes whose GPU indices are not interchangeable within a node: buddy blocks are aligned;
# yarn re-packs every job each cycle, as the research simulators it reproduces do.
FIXED_SCHEMES = frozenset({"buddy", "yarn"})


def keep_in_plan(run: dict[str, GpuSlots], kept: int, groups: Mapping[str, tuple[str, ...]],
                 running: Callable[[str], tuple[GpuSlots, tuple[str, ...]] | None],
                 topology: Topology, scheme: str) -> None:
    """`keep_own_indices` on a plan's `run` (in place; its first `kept` jobs stay where they
    are): `running(job)` is a running job's GPUs and group, None for a job not running. Jobs
    that share GPUs (in a group now or before) are left as placed."""
    if scheme in FIXED_SCHEMES or len(run) <= kept:
        return
    changed = [(j, slots) for j, slots in islice(run.items(), kept, None) if not groups.get(j)]
    was: dict[str, GpuSlots] = {}
    for job_id, _ in changed:
        now = running(job_id)
        if now is not None and not now[1]:
            was[job_id] = now[0]
    if not was:
        return
    nvlink, out = topology.nvlink, topology.out
    run.update(keep_own_indices(changed, was,
                                lambda node: not nvlink.get(node) and node not in out))


def keep_own_indices(changed: Iterable[tuple[str, GpuSlots]], was: Mapping[str, GpuSlots],
                     swappable: Callable[[str], bool]) -> dict[str, GpuSlots]:
    """The jobs of `changed` (job, its new GPUs: every job the cycle starts or moves, none
    sharing a GPU) whose GPUs are dealt out again, with their new GPUs. `was`: where the
    running ones among them run now; `swappable(node)`: whether that node's GPUs are
    interchangeable. A job in `was` whose nodes and counts are unchanged gets exactly its old
    GPUs back where every one of its nodes allows it."""
    placed = list(changed)
    wanted: dict[str, GpuSlots] = {}  # jobs that could keep theirs → their old GPUs
    for job_id, slots in placed:
        old = was.get(job_id)
        if old is not None and old != slots and _shape(old) == _shape(slots):
            wanted[job_id] = old
    if not wanted:
        return {}
    nodes = {node_id for old in wanted.values() for node_id, _ in old}
    on_node: dict[str, list[tuple[str, tuple[int, ...]]]] = {n: [] for n in nodes}
    for job_id, slots in placed:
        for node_id, gpus in slots:
            if node_id in on_node:
                on_node[node_id].append((job_id, gpus))
    # A job keeps its GPUs only if every one of its nodes allows it (else it restarts anyway).
    refused: set[str] = set()
    for node_id, jobs in on_node.items():
        in_use = {g for _, gpus in jobs for g in gpus}
        if not swappable(node_id) or len(in_use) != sum(len(gpus) for _, gpus in jobs):
            refused.update(j for j, _ in jobs if j in wanted)
            continue
        claimed: dict[int, str] = {}
        for job_id, _ in jobs:
            own = _on(wanted.get(job_id), node_id)
            if own is None:
                continue
            if not in_use.issuperset(own) or any(g in claimed for g in own):
                refused.add(job_id)
                refused.update(claimed[g] for g in own if g in claimed)
            claimed.update(dict.fromkeys(own, job_id))
    keep = {j: old for j, old in wanted.items() if j not in refused}
    if not keep:
        return {}
    dealt: dict[str, dict[str, tuple[int, ...]]] = {}  # job → node → its GPUs there, if new
    for node_id, jobs in on_node.items():
        if not any(j in keep for j, _ in jobs):
            continue
        left = {g for _, gpus in jobs for g in gpus}  # the node's GPUs in use...
        for job_id, _ in jobs:
            own = _on(keep.get(job_id), node_id)
            if own is not None:
                left.difference_update(own)  # ...but those the kept jobs take back
        others = [(j, gpus) for j, gpus in jobs if j not in keep]
        pool = sorted(left.difference(g for _, gpus in others for g in gpus))
        # `left` is what the other jobs share: each keeps what it had of it, then tops up.
        for job_id, gpus in others:
            mine = [g for g in gpus if g in left]
            if len(mine) == len(gpus):
                continue
            extra, pool = pool[:len(gpus) - len(mine)], pool[len(gpus) - len(mine):]
            dealt.setdefault(job_id, {})[node_id] = tuple(sorted(mine + extra))
    out = dict(keep)
    for job_id, slots in placed:
        new = dealt.get(job_id)
        if new is not None:
            out[job_id] = tuple((n, new.get(n, gpus)) for n, gpus in slots)
    return out


def _shape(slots: GpuSlots) -> dict[str, int]:
    return {node_id: len(gpus) for node_id, gpus in slots}


def _on(slots: GpuSlots | None, node_id: str) -> tuple[int, ...] | None:
    if slots is None:
        return None
    for n, gpus in slots:
        if n == node_id:
            return gpus
    return None
