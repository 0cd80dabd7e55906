"""Running jobs stay where they run when a cycle's placement can be dealt out otherwise to the
same effect, so they do not restart for nothing.

A walk that re-places running jobs may hand a job's GPUs to a gang placed before it and give
the job other GPUs: the same resources elsewhere, but a stop and a relaunch. Two ways back,
each leaving every node with the same GPUs in use and every job with as many GPUs:

- trading nodes (`trade_nodes`): a running job moved off its node goes back where the two
  nodes can swap sets of single-node gangs with as many GPUs (one gang of its size, or two
  half its size, or it and others for one wider gang; nodes of one GPU type);
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
Gang = tuple[str, int, int]  # a single-node gang to trade: job, its GPUs, 1 if it goes home


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
    # A running job placed where it runs takes no part in either way: the GPUs it keeps are
    # no other job's old ones, and it neither moves nor is dealt other GPUs. So a cycle costs
    # the jobs it starts and moves, not those it walked and left in place.
    changed: list[tuple[str, GpuSlots]] = []
    was: dict[str, GpuSlots] = {}  # the running ones among them: where they run now
    for job_id, slots in islice(run.items(), kept, None):
        if groups.get(job_id):
            continue
        rec = running.get(job_id)
        if rec is None or rec.group:
            changed.append((job_id, slots))
        elif rec.placement is not slots and rec.placement != slots:
            changed.append((job_id, slots))
            was[job_id] = rec.placement
    if not was:  # most cycles move no running job
        return
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
    """The jobs of `changed` (as `deal_indices`) that trade nodes, with their new GPUs.

    A running job (of `was`) moved off its one node A onto one node B goes back to A where
    the two nodes can swap sets of single-node gangs the cycle put on them, as many GPUs on
    each side: the job and others on B for some on A (one 4-GPU gang for two 2-GPU jobs, or
    the reverse). Of the swaps, the one that brings the most running jobs home, then moves
    the fewest gangs. Nodes of one GPU type, both interchangeable; a running job back on its
    own node never moves, and a job goes home only where the GPUs it had there are all in
    use (`deal_indices` then gives them back), so every node keeps the GPUs it uses."""
    placed = dict(changed)
    before: dict[str, str] = {}  # running jobs' one node before this cycle
    for job_id, old in was.items():
        if len(old) == 1 and job_id in placed:
            before[job_id] = old[0][0]
    # Running jobs on one node now, another before: only their two nodes can trade.
    moved = [job_id for job_id, node_id in before.items()
             if len(placed[job_id]) == 1 and placed[job_id][0][0] != node_id]
    if not moved:
        return {}
    nodes = {before[j] for j in moved} | {placed[j][0][0] for j in moved}
    on_node: dict[str, list[str]] = {}  # single-node gangs by node, in plan order
    in_use: dict[str, set[int]] = {}  # GPUs the cycle uses per node (trades keep them so)
    for job_id, slots in placed.items():
        for node_id, gpus in slots:
            if node_id in nodes:
                in_use.setdefault(node_id, set()).update(gpus)
                if len(slots) == 1:
                    on_node.setdefault(node_id, []).append(job_id)
    homes: dict[str, str] = {}  # moved jobs whose going back spares them a restart
    for job_id in moved:
        node_id, gpus = was[job_id][0]
        if (len(placed[job_id][0][1]) == len(gpus) and swappable(node_id)
                and in_use.get(node_id, set()).issuperset(gpus)):
            homes[job_id] = node_id
    traded: dict[str, GpuSlots] = {}
    for job_id, home in homes.items():
        now = placed[job_id][0][0]
        if now == home or type_of.get(home) != type_of.get(now) or not swappable(now):
            continue
        here = _movable(on_node.get(home, []), home, now, placed, before, homes)
        there = _movable(on_node[now], now, home, placed, before, homes)
        swap = _best_swap(here, [g for g in there if g[0] != job_id],
                          (job_id, len(placed[job_id][0][1]), 1))
        if swap is None:
            continue
        away, back = swap  # from `home` to `now`, and from `now` to `home`
        # Each side takes the GPUs the other side leaves.
        for members, left, frm, to in ((away, back, home, now), (back, away, now, home)):
            pool = sorted(g for j in left for g in placed[j][0][1])
            for j in members:
                k = len(placed[j][0][1])
                traded[j], pool = ((to, tuple(pool[:k])),), pool[k:]
            on_node[frm] = [j for j in on_node[frm] if j not in members]
            on_node.setdefault(to, []).extend(members)
        # Placed anew after both sides took the other's GPUs.
        for j in (*away, *back):
            placed[j] = traded[j]
    return traded


def _movable(gangs: list[str], node_id: str, to: str, placed: Mapping[str, GpuSlots],
             before: Mapping[str, str], homes: Mapping[str, str]) -> list[Gang]:
    """The `gangs` on `node_id` that may leave it for `to` (a running job back on its own
    node stays): job, GPUs, and whether `to` is its home."""
    return [(j, len(placed[j][0][1]), int(homes.get(j) == to))
            for j in gangs if before.get(j) != node_id]


def _best_swap(here: list[Gang], there: list[Gang], mover: Gang
               ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Gangs of `here` to swap for `mover` and gangs of `there`, as many GPUs each way, with
    the most gangs sent home, then the fewest moved; None where no such set exists."""
    sets_here, sets_there = _best_sets(here), _best_sets(there)
    best: tuple[int, int, tuple[str, ...], tuple[str, ...]] | None = None
    for total, (home_a, moved_a, away) in sorted(sets_here.items()):
        rest = sets_there.get(total - mover[1])
        if total == 0 or rest is None:
            continue
        home_b, moved_b, back = rest
        score = (home_a + home_b + mover[2], -(moved_a + moved_b + 1))
        if best is None or score > best[:2]:
            best = (*score, away, (mover[0], *back))
    return None if best is None else (best[2], best[3])


def _best_sets(gangs: list[Gang]) -> dict[int, tuple[int, int, tuple[str, ...]]]:
    """Per GPU total, the set of `gangs` summing to it that sends the most home, then moves
    the fewest (the first such in their order): (sent home, moved, jobs)."""
    best: dict[int, tuple[int, int, tuple[str, ...]]] = {0: (0, 0, ())}
    for job_id, gpus, home in gangs:
        for total, (sent, moved, jobs) in list(best.items()):  # each gang at most once
            have = best.get(total + gpus)
            if have is None or (sent + home, -moved - 1) > (have[0], -have[1]):
                best[total + gpus] = (sent + home, moved + 1, (*jobs, job_id))
    return best


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
