"""Running jobs stay where they run when a cycle's placement can be dealt out otherwise to the
same effect, so they do not restart for nothing.

A walk that re-places running jobs may hand a job's GPUs to a gang placed before it and give
the job other GPUs: the same resources elsewhere, but a stop and a relaunch. Two ways back,
each leaving every node with the same GPUs in use and every job with as many GPUs:

- trading nodes (`trade_nodes`): a running job moved off its node, where the cycle put another
  single-node gang of its size, trades places with that gang (nodes of one GPU type);
- dealing indices (`deal_indices`): the GPUs a cycle uses on a node are dealt out again among
  the jobs it placed there, each running job left on the same nodes with as many GPUs on each
  getting its own back, the others taking what is left, their own first.

Only where GPUs are interchangeable: no NVLink islands learned, none out of service; not
`buddy` (aligned blocks) nor `yarn` (re-packs every job each cycle, as the research simulators
it reproduces do); nodes are not traded for a policy that chose them itself (Pollux, Gandiva's
node sets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Protocol

from domain.topology import Topology
from schemas.events import GpuSlots

FIXED_SCHEMES = frozenset({"buddy", "yarn"})


class Running(Protocol):
    """A running job as the scheduler keeps it: its GPUs, and the jobs it shares them with."""

    @property
    def placement(self) -> GpuSlots: ...

    @property
    def group(self) -> tuple[str, ...]: ...


def keep_in_plan(run: dict[str, GpuSlots], kept: int, groups: Mapping[str, tuple[str, ...]],
                 running: Mapping[str, Running], topology: Topology, scheme: str, *,
                 nodes_chosen: bool = False) -> None:
    """Both, on a plan's `run` (in place; its first `kept` jobs stay where they are), `running`
    the jobs running now; `nodes_chosen`: the policy chose each job's nodes (no trading). Jobs
    that share GPUs (in a group now or before) are left as placed."""
    if scheme in FIXED_SCHEMES or len(run) <= kept:
        return
    for job_id, slots in islice(run.items(), kept, None):  # most cycles move no running job
        rec = running.get(job_id)
        if (rec is not None and rec.placement is not slots and rec.placement != slots
                and not rec.group and not groups.get(job_id)):
            break
    else:
        return
    changed: list[tuple[str, GpuSlots]] = []
    was: dict[str, GpuSlots] = {}  # the running ones among them: where they run now
    for job_id, slots in islice(run.items(), kept, None):
        if groups.get(job_id):
            continue
        changed.append((job_id, slots))
        rec = running.get(job_id)
        if rec is not None and not rec.group:
            was[job_id] = rec.placement
    nvlink, out = topology.nvlink, topology.out

    def swappable(node: str) -> bool:
        return not nvlink.get(node) and node not in out

    if not nodes_chosen:
        traded = trade_nodes(changed, was, swappable, topology.type_of)
        if traded:
            run.update(traded)
            changed = [(j, traded.get(j, slots)) for j, slots in changed]
    run.update(deal_indices(changed, was, swappable))


def trade_nodes(changed: Iterable[tuple[str, GpuSlots]], was: Mapping[str, GpuSlots],
                swappable: Callable[[str], bool], type_of: Mapping[str, str]
                ) -> dict[str, GpuSlots]:
    """The jobs of `changed` (as `deal_indices`) that trade places, with their new GPUs: a
    running job (of `was`) on one node before and now on another, each with k GPUs, takes the
    place of the first other single-node k-GPU gang on its old node (of the same GPU type,
    both nodes interchangeable) that is not a running job already back on its own node,
    where the GPUs it had there are all in use (`deal_indices` then gives them back)."""
    placed = dict(changed)
    on_node: dict[str, list[str]] = {}  # single-node gangs by node, in plan order
    in_use: dict[str, set[int]] = {}  # GPUs the cycle uses per node (trades keep them so)
    for job_id, slots in placed.items():
        if len(slots) == 1:
            on_node.setdefault(slots[0][0], []).append(job_id)
        for node_id, gpus in slots:
            in_use.setdefault(node_id, set()).update(gpus)
    traded: dict[str, GpuSlots] = {}

    def home(job_id: str) -> bool:
        old = was.get(job_id)
        return old is not None and len(old) == 1 and placed[job_id][0][0] == old[0][0]

    for job_id, old in was.items():
        slots = placed[job_id]
        if len(old) != 1 or len(slots) != 1 or home(job_id):
            continue
        (before, gpus), (now, mine) = old[0], slots[0]
        # Back on its node only to restart there is no gain: its own GPUs must be in use.
        if (len(gpus) != len(mine) or type_of.get(before) != type_of.get(now)
                or not (swappable(before) and swappable(now))
                or not in_use.get(before, set()).issuperset(gpus)):
            continue
        other = next((j for j in on_node.get(before, ())
                      if len(placed[j][0][1]) == len(mine) and not home(j)), None)
        if other is None:
            continue
        placed[job_id], placed[other] = placed[other], slots
        traded[job_id], traded[other] = placed[job_id], slots
        on_node[before].remove(other)
        on_node[before].append(job_id)
        on_node[now].remove(job_id)
        on_node[now].append(other)
    return traded


def deal_indices(changed: Iterable[tuple[str, GpuSlots]], was: Mapping[str, GpuSlots],
                 swappable: Callable[[str], bool]) -> dict[str, GpuSlots]:
    """The jobs of `changed` (job, its new GPUs: every job the cycle starts or re-places, none
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
