"""Placement of gangs onto switches → nodes → GPUs, one scheduling cycle at a time.

`CyclePlacement` starts every cycle from an empty cluster (running jobs' GPUs held for them)
and places jobs in the order the policy walks them, all-or-nothing. It lasts across cycles, so a
cycle costs what it places rather than the cluster's size. The schemes:

- `consolidated` (Muri/Tiresias "yarn"): a job that fits in one node gets one node; a bigger job
  gets whole free nodes plus one node for the remainder, all under one switch.
- `count`: only the number of free GPUs matters (Tiresias' dlas path); GPUs are still chosen
  consolidated when possible, else from as few nodes as possible. Counts then decide a walk
  (`counts_decide`): the walk learns up front which running jobs stay and lets the others go
  (`let_go`), so a job that starts takes their GPUs and no staying job moves; a walk that
  knows them from the running jobs' ranks alone opens the cycle in place without those
  (`stay_but`), never reading the jobs that stay.
- `yarn`: the research simulators' own rule for compatibility runs: consolidated like the
  first, but first fit in node order and every job re-placed from scratch each cycle (running
  jobs move freely), as Muri's and Tiresias' simulators re-pack the cluster at every event.
- `buddy` (ElasticFlow's elastic placement): a gang of 2^k GPUs takes an aligned block, GPUs
  [i·2^k, (i+1)·2^k) of one node, or 2^k / node-size whole nodes in a row (aligned, under one
  switch), so an elastic job that halves or doubles stays contiguous and blocks do not
  fragment each other; tightest node first. Other gang sizes are placed consolidated.

The shapes a gang takes beyond one node (whole nodes and a remainder, a buddy block, a spread)
are in `domain.gang_shapes`; this module keeps the cycle's free-GPU state and picks among them.

Running jobs keep their GPUs when those are still free ("sticky"), and new jobs prefer GPUs no
running job holds, so a re-plan moves as few jobs as possible. The tightest node for a new job
is judged by those GPUs too, so where a job that displaces nobody lands does not depend on
which running jobs the walk has re-placed before it: a walk that places it with every running
job in place lands it on the same GPUs. Both schemes are monotone: if a gang of g GPUs does
not fit, no bigger gang fits either, which lets policies skip ahead.

GPUs taken out of service (a node's failed health check, `Topology.take_out`) are cordoned one
at a time, as a drained node is whole: nothing new lands on them, a running job keeps its own.

On a heterogeneous cluster a policy may ask for one GPU type (`try_place(..., gpu_type=)`): the
same rules then apply to the nodes of that type only; without a type any node may be used.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal

from domain.compiled import mypyc_attr
from domain.free_gpus import FreeIndex, NodeGpus
from domain.gang_shapes import buddy_block, multi_node, spread
from domain.topology import Topology
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots

Scheme = Literal["consolidated", "count", "yarn", "buddy"]
SCHEMES: tuple[Scheme, ...] = ("consolidated", "count", "yarn", "buddy")
INDEX_FROM = 32  # nodes in a pool from which an index beats scanning them


@mypyc_attr(allow_interpreted_subclasses=True)  # copyable: forecasts fork the state
class CyclePlacement:
    """Free-GPU state of one cycle; `try_place` reserves a gang or returns None.

    It lasts across cycles: between cycles the scheduler tells it which jobs now run where
    (`bind`, `release`), and `next_cycle` starts the next one, resetting only the nodes the last
    cycle or the bindings touched. A cycle therefore costs what it places, not the cluster's
    size; built with `previous` it is the first cycle after those bindings.

    A cycle opened `in_place` leaves every running job on its GPUs (taken, not held): the
    state a cycle reaches once it has re-placed each running job where it was, reached
    without walking them. Between cycles the nodes are kept so, and only a cycle that
    re-places running jobs turns their GPUs into held ones: every one of them when the cycle
    is first used, or only those of the jobs a walk re-places (`keep_all_but`).
    """

    # A gang's fit depends on its size (and GPU type) only, and a cycle only takes GPUs: a
    # size that did not fit does not fit again until the next cycle (policies skip ahead).
    fails_by_size = True

    def __init__(
        self,
        cluster: ClusterSpec | Topology,
        scheme: Scheme = "consolidated",
        previous: Mapping[str, GpuSlots] | None = None,
        cordoned: Collection[str] = (),
        *,
        index_from: int = INDEX_FROM,
    ) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown placement scheme {scheme!r}; known: {', '.join(SCHEMES)}")
        topo = cluster if isinstance(cluster, Topology) else Topology(cluster)
        self.scheme = scheme
        self._topo = topo
        self._nodes = nodes = [NodeGpus(nid, sw, size, (1 << size) - 1, 0, gpu_type,
                                     topo.nvlink.get(nid, ()), pos)
                               for pos, (nid, sw, size, gpu_type) in enumerate(topo.nodes)]
        self._links_seen = topo.links_learned
        self._switches = [[nodes[i] for i in group] for group in topo.switch_groups]
        self._type_of = topo.type_of
        types = topo.cluster.gpus_by_type
        # Per GPU type: its nodes and its part of each switch (heterogeneous clusters only).
        self._pools: dict[str | None, tuple[list[NodeGpus], list[list[NodeGpus]]]] = {}
        if len(types) > 1:
            for t in types:
                sw = [[n for n in group if n.gpu_type == t] for group in self._switches]
                self._pools[t] = ([n for n in nodes if n.gpu_type == t], [g for g in sw if g])
        # Big pools are searched through an index; small ones are scanned (cheaper there).
        self._indexes: dict[str | None, FreeIndex] = {}
        if len(nodes) >= index_from:
            self._indexes[None] = FreeIndex(nodes, self._switches)
        for pool, (members, switches) in self._pools.items():
            if len(members) >= index_from:
                self._indexes[pool] = FreeIndex(members, switches)
        # Running jobs' GPUs, as bound between cycles (None: GPUs that no longer exist).
        self._bound: dict[str, GpuSlots] = {}
        self._bound_at: dict[str, list[tuple[NodeGpus, int]] | None] = {}
        self._dirty: dict[int, NodeGpus] = {}  # nodes to reset before the next cycle
        self._stale: dict[int, NodeGpus] = {}  # nodes to re-file before the index is asked
        self._busy: dict[int, NodeGpus] = {}  # nodes some running job is bound to
        self._shared: set[int] = set()  # nodes where running jobs' GPUs overlap (co-located)
        self._lost: set[str] = set()  # running jobs whose GPUs no longer exist
        self._busy_gpus = 0
        self._busy_by_type = dict.fromkeys(types, 0)
        self.in_place = False
        self._holding = False  # opened in full, its running jobs' GPUs not yet held (below)
        # Jobs a walk re-places whose GPUs are to be held, once the cycle is used (a walk
        # where counts decide may never need them held: `let_go`).
        self._pending: AbstractSet[str] | None = None
        # With nodes of one size both schemes are monotone (if g GPUs do not fit, g' > g do
        # not either), which lets policies skip ahead; mixed node sizes break that.
        # Buddy blocks mixed with consolidated odd sizes promise no such order.
        self.monotone = topo.uniform and scheme != "buddy"
        self._out: dict[int, int] = {}  # node position → its GPUs out of service, this cycle
        for job_id, slots in (previous or {}).items():
            self.bind(job_id, slots)
        self.next_cycle(cordoned)

    # -- between cycles ----------------------------------------------------------------------
    def bind(self, job_id: str, slots: GpuSlots) -> None:
        """`job_id` runs on `slots` from now on: held for it, and kept if it can be, next cycle
        (yarn re-packs every cycle, so it holds nothing)."""
        if self.scheme == "yarn":
            return
        self.release(job_id)
        masks = self._topo.masks(slots)
        self._bound[job_id] = slots
        if masks is None:
            self._bound_at[job_id] = None
            self._lost.add(job_id)
            return
        at = []
        for i, m in masks:
            node = self._nodes[i]
            node.holders[job_id] = m
            self._occupy(node)
            at.append((node, m))
        self._bound_at[job_id] = at

    def release(self, job_id: str) -> None:
        """`job_id` no longer runs (stopped, finished, moved)."""
        if self._bound.pop(job_id, None) is None:
            return
        self._lost.discard(job_id)
        for node, _ in self._bound_at.pop(job_id) or ():
            del node.holders[job_id]
            self._occupy(node)

    def _occupy(self, node: NodeGpus) -> None:
        """Recount a node's occupied GPUs after its holders changed."""
        occupied = gpus = 0
        for m in node.holders.values():
            occupied |= m
            gpus += m.bit_count()
        if gpus != occupied.bit_count():
            self._shared.add(node.pos)
        else:
            self._shared.discard(node.pos)
        change = occupied.bit_count() - node.occupied.bit_count()
        node.occupied = occupied
        self._busy_gpus += change
        self._busy_by_type[node.gpu_type] += change
        if occupied:
            self._busy[node.pos] = node
        else:
            self._busy.pop(node.pos, None)
        self._dirty[node.pos] = node

    def next_cycle(self, cordoned: Collection[str] = (), *, in_place: bool = False) -> None:
        """Start a cycle: every GPU free, running jobs' GPUs held until they are re-placed (or,
        `in_place`, taken by them for the whole cycle); `cordoned` nodes (drained or lost)
        take nothing new."""
        topo = self._topo
        if self._links_seen != topo.links_learned:
            self._links_seen = topo.links_learned
            for node in self._nodes:
                node.nvlink = topo.nvlink.get(node.node_id, ())
        stale = self._stale if self._indexes else None
        for pos, node in self._dirty.items():  # back to running jobs in place
            node.free = ((1 << node.size) - 1) & ~node.occupied
            node.held = 0
            if stale is not None:
                stale[pos] = node  # as `_reindex`
        self._dirty = {}
        self._kept: set[str] = set()  # running jobs re-placed (or not) this cycle
        self.placed: dict[str, GpuSlots] = {}
        self.in_place = in_place
        self._holding = False
        self._pending = None
        # With `stay_all_but`: the only running jobs the walk may re-place (the others stay).
        self._only: AbstractSet[str] | None = None
        self._free_by_type = dict(topo.cluster.gpus_by_type)
        if in_place:
            self.free_gpus = topo.total_gpus - self._busy_gpus
            for gpu_type, busy in self._busy_by_type.items():
                self._free_by_type[gpu_type] -= busy
        else:
            # Running jobs' GPUs are held when the cycle is first used (`_hold_all`), or only
            # those of the jobs a walk re-places (`keep_all_but`). Until then the nodes stand
            # as in place, which GPUs out of service would change: those hold at once.
            self.free_gpus = topo.total_gpus
            self._holding = True
        self._out = {}
        if topo.out:
            self._hold_all()
            self._take_out(topo)
        # Drained nodes (`loom drain`): jobs running there keep their GPUs, nothing new lands.
        self.cordoned = frozenset(cordoned)
        for node_id in self.cordoned:
            i = topo.index.get(node_id)
            if i is not None:
                node = self._nodes[i]
                idle = node.unheld_free()
                self.free_gpus -= idle
                self._free_by_type[node.gpu_type] -= idle

    def _hold_all(self) -> None:
        """Every running job's GPUs free again, but held for it (a cycle opened in full), or
        only those of the jobs a walk re-places (`keep_all_but`)."""
        if self._pending is not None:
            self._hold_walked(self._pending)
            self._pending = None
        if not self._holding:
            return
        self._holding = False
        dirty, stale = self._dirty, self._stale if self._indexes else None
        for pos, node in self._busy.items():
            node.free = (1 << node.size) - 1
            node.held = node.occupied
            dirty[pos] = node  # as `_moved`
            if stale is not None:
                stale[pos] = node

    def _take_out(self, topo: Topology) -> None:
        """GPUs out of service leave the free pool; one a running job holds is still counted
        free, for that job alone to keep (`_keep`), as on a drained node."""
        for node_id, out in topo.out.items():
            node = self._nodes[topo.index[node_id]]
            self._out[node.pos] = out
            gone = node.free & out
            if gone:
                node.free &= ~out
                idle = (gone & ~node.held).bit_count()
                self.free_gpus -= idle
                self._free_by_type[node.gpu_type] -= idle
                self._moved(node)

    def _reindex(self, node: NodeGpus) -> None:
        if self._indexes:
            self._stale[node.pos] = node

    def _flush(self) -> None:
        """Re-file the nodes that changed since the index was last asked (a node that changes
        and changes back in between costs nothing there)."""
        for node in self._stale.values():
            for key in (None, node.gpu_type):
                index = self._indexes.get(key)
                if index is not None:
                    index.update(node)
        self._stale = {}

    def _moved(self, node: NodeGpus) -> None:
        """A node's GPUs changed this cycle: reset it before the next, re-file it."""
        self._dirty[node.pos] = node
        self._reindex(node)

    # -- queries used for "why is my job pending" ------------------------------------------
    def largest_block(self) -> int:
        self._hold_all()
        index = self._indexes.get(None)
        if index is not None:
            self._flush()
            return index.largest()
        return max((n.n_free for n in self._nodes), default=0)

    def explain(self, gpus: int) -> str:
        if gpus > self.free_gpus:
            return f"needs {gpus} GPUs, {self.free_gpus} free"
        return (
            f"needs {gpus} GPUs placed together; {self.free_gpus} free but the largest block "
            f"in one node is {self.largest_block()}"
        )

    def free_of(self, gpu_type: str) -> int:
        """Free GPUs of one type this cycle."""
        return self._free_by_type.get(gpu_type, 0)

    def blocked_displacing(self, gpus: int, victims: Iterable[str]) -> bool:
        """In a cycle opened in place: whether a walk opened in full would certainly find no
        room for a gang of `gpus` (that displaces nobody) even where it may displace the
        running jobs `victims`, and would then still re-place each of them (none as large).
        Bounded from above by this cycle's GPUs before it placed anything, plus the victims'.
        False where unsure (GPUs chosen by count, nodes of several sizes)."""
        assert self.in_place, "asked of a cycle opened in place"
        index = self._topo.index
        room: dict[int, int] = {}  # node position → GPUs placed this cycle, and the victims'
        for slots in self.placed.values():
            for node_id, taken in slots:
                pos = index[node_id]
                room[pos] = room.get(pos, 0) + len(taken)
        total = self.free_gpus + sum(room.values())
        for job_id in victims:
            at = self._bound_at.get(job_id)
            held = sum(m.bit_count() for _, m in at or ())
            if at is None or held >= gpus:
                return False  # lost GPUs, or one the full walk would skip once the gang fails
            total += held
            for node, m in at:
                room[node.pos] = room.get(node.pos, 0) + m.bit_count()
        if gpus > total:
            return True  # too few GPUs: `try_place`'s first test
        nodes = self._nodes
        if self.scheme != "consolidated" or not self._topo.uniform:
            return False
        size = nodes[0].size
        if gpus <= size:  # one node must hold it: none has room (untouched ones as they are)
            return (self.largest_block() < gpus
                    and all(nodes[pos].n_free + extra < gpus for pos, extra in room.items()))
        # Whole nodes under one switch (and a remainder): no switch has enough. A node given
        # room is not whole now; counted as whole with it, beside the index's whole nodes.
        gained: dict[str, int] = {}
        for pos, extra in room.items():
            if nodes[pos].n_free + extra == size:
                gained[nodes[pos].switch] = gained.get(nodes[pos].switch, 0) + 1
        free_index = self._indexes.get(None)
        if free_index is not None:
            self._flush()
        whole = None if free_index is None else free_index.whole(True)
        return all((whole[i] if whole is not None else sum(n.n_free == size for n in group))
                   + gained.get(group[0].switch, 0) < gpus // size
                   for i, group in enumerate(self._switches))

    # -- placement -------------------------------------------------------------------------
    def try_place(self, job_id: str, gpus: int, gpu_type: str | None = None,
                  within: Collection[str] | None = None) -> GpuSlots | None:
        """Reserve `gpus` GPUs (of `gpu_type`; only on the nodes `within`, when given)."""
        if gpus > self.free_gpus or gpus <= 0:
            return None
        if gpu_type is not None and gpus > self._free_by_type.get(gpu_type, 0):
            return None
        if self._holding or self._pending is not None:
            self._hold_all()
        # A running job keeps its GPUs even on a drained node; new placements avoid those.
        slots = self._keep(job_id, gpus, gpu_type, within)
        if slots is not None:  # most calls, at scale: nothing to search
            self._kept_back(job_id, slots, gpus)
            return slots
        nodes, switches = self._pools.get(gpu_type, (self._nodes, self._switches))
        index = self._indexes.get(gpu_type)
        allowed = within
        if self.cordoned:
            allowed = {n.node_id for n in nodes if n.node_id not in self.cordoned
                       and (within is None or n.node_id in within)}
        if allowed is not None:
            # A policy that partitions the cluster itself (Gandiva's node sets), or a drain.
            index = None
            nodes = [n for n in nodes if n.node_id in allowed]
            switches = [kept for group in switches
                        if (kept := [n for n in group if n.node_id in allowed])]
        # First without touching GPUs that running jobs still hold, then allowing it.
        for displace in (False, True):
            if self.scheme == "buddy" and gpus & (gpus - 1) == 0:
                slots = buddy_block(switches, gpus, displace)
            else:
                slots = self._consolidated(nodes, switches, gpus, displace, index)
                if slots is None and self.scheme == "count":
                    slots = spread(nodes, switches, gpus, displace,
                                   self._switch_free(index, displace),
                                   None if index is None else self._fullest(index, displace))
            if slots is not None:
                break
        if slots is not None:
            self.free_gpus -= gpus
            self.placed[job_id] = slots
            for node_id, taken in slots:
                self._free_by_type[self._type_of[node_id]] -= len(taken)
                self._moved(self._nodes[self._topo.index[node_id]])
        return slots

    def keep_ahead(self, job_ids: Collection[str]) -> dict[str, GpuSlots] | None:
        """First thing in a cycle opened in full: give these running jobs back their own GPUs,
        as a walk that re-placed them before anything else would (`try_place` on each, in
        any order: each takes only its own GPUs, and the cycle counts every GPU a running
        job holds as free). None, with nothing done, where it might not: something placed
        already, a job not bound or whose GPUs are gone, or several GPU types (a job's
        profile may have the walk try another type first). Jobs that share GPUs, or hold
        other than their gang's count, are the caller's to leave out: one whose GPUs another
        took first raises."""
        bound_at = self._bound_at
        if (self.in_place or self.placed or self._kept or self._only is not None
                or len(self._free_by_type) > 1
                or any(bound_at.get(j) is None for j in job_ids)):
            return None
        self._hold_all()
        kept: dict[str, GpuSlots] = {}
        taken = 0
        for job_id in job_ids:
            gpus = sum(m.bit_count() for _, m in bound_at[job_id] or ())
            slots = self._keep(job_id, gpus, None)
            if slots is None:
                raise ValueError(f"job {job_id} cannot be kept ahead: another job kept "
                                 f"before it holds some of its GPUs")
            kept[job_id] = slots
            taken += gpus
        self.placed.update(kept)
        self.free_gpus -= taken
        for gpu_type in self._free_by_type:
            self._free_by_type[gpu_type] -= taken
        return kept

    def keep_all_but(self, running: Collection[str], walked: AbstractSet[str]
                     ) -> dict[str, GpuSlots] | None:
        """`keep_ahead` for the `running` jobs but `walked` (which the walk re-places), at the
        cost of the walked ones: only their GPUs are turned held (when the cycle is first
        used: a walk where counts decide may let them go first), and the others' are left
        taken, as a cycle in place has them. The same state, provided `running` are the jobs
        bound and no two of them share a GPU (else None, nothing done, as where `keep_ahead`
        would refuse)."""
        if self._bound.keys() != running:
            return None
        if not self._holding:  # held already (GPUs out of service): one by one
            return self.keep_ahead([j for j in self._bound if j not in walked])
        if not self._keep_unlisted(walked):
            return None
        kept = {j: slots for j, slots in self._bound.items() if j not in walked}
        self._kept.update(kept)
        self.placed.update(kept)
        return kept

    def stay_all_but(self, running: Collection[str], walked: AbstractSet[str]) -> bool:
        """`keep_all_but` for a plan that lists only the jobs it walks (`Plan.stay`): the
        others stay where they run, unlisted, so beyond checking `running` against the jobs
        bound the call costs the walked jobs alone. False, with nothing done, where
        `keep_all_but` would refuse."""
        if self._bound.keys() != running:
            return False
        if not self._holding:  # held already (GPUs out of service): one by one
            return self.keep_ahead([j for j in self._bound if j not in walked]) is not None
        if not self._keep_unlisted(walked):
            return False
        self._only = walked
        return True

    def _keep_unlisted(self, walked: AbstractSet[str]) -> bool:
        """`keep_all_but`'s state, but for marking the kept jobs kept and placed: only the
        walked jobs' GPUs held, the others' taken."""
        if (self.placed or self._kept or self._only is not None or len(self._free_by_type) > 1
                or self._shared or not self._lost <= walked):
            return False
        self._holding = False
        self._pending = walked  # held when the cycle is first used (`_hold_all`)
        bound_at = self._bound_at
        held = 0
        for job_id in walked:
            for _, m in bound_at.get(job_id) or ():
                held += m.bit_count()
        taken = self._busy_gpus - held
        self.free_gpus -= taken
        for gpu_type in self._free_by_type:
            self._free_by_type[gpu_type] -= taken
        return True

    def keep_in_turn(self, job_ids: Sequence[str], gpus: Sequence[int], below: int,
                     start: int = 0) -> list[GpuSlots | None]:
        """Running jobs a walk reaches one after another (`job_ids[start:]`), each given back
        its own GPUs as `try_place(job_ids[k], gpus[k])` would (`_keep`) where they are all
        still free and as many as it asks for, or passed over (None) where it asks for
        `below` GPUs or more, or more than are free, as a walk passes over a gang that can no
        longer fit. Stops at the first it cannot decide so, left as `try_place` leaves a job
        it could not give its own GPUs back before it searches (the walk then places it as
        any job), or once no GPU is free (the walk ends); one entry per job decided, in
        order. Nothing where a GPU type or GPUs out of service would make `try_place` judge
        otherwise."""
        out: list[GpuSlots | None] = []
        if self.in_place or self._out or len(self._free_by_type) > 1:
            return out
        if self._holding or self._pending is not None:
            self._hold_all()
        for k in range(start, len(job_ids)):
            if self.free_gpus <= 0:
                break
            job_id, g = job_ids[k], gpus[k]
            if g >= below or g > self.free_gpus:
                out.append(None)
                continue
            if g <= 0:
                break
            slots = self._keep(job_id, g, None)
            if slots is None:
                break
            self._kept_back(job_id, slots, g)
            out.append(slots)
        return out

    def _kept_back(self, job_id: str, slots: GpuSlots, gpus: int) -> None:
        """A running job has its own GPUs back (`_keep`): they leave the free count."""
        self.free_gpus -= gpus
        self.placed[job_id] = slots
        by_type, type_of = self._free_by_type, self._type_of
        for node_id, taken in slots:
            by_type[type_of[node_id]] -= len(taken)

    def _hold_walked(self, walked: AbstractSet[str]) -> None:
        """The GPUs of the jobs a walk re-places free again, but held for them."""
        dirty, stale, bound_at = self._dirty, self._stale if self._indexes else None, self._bound_at
        for job_id in walked:
            for node, m in bound_at.get(job_id) or ():
                node.free |= m
                node.held |= m
                dirty[node.pos] = node  # as `_moved`
                if stale is not None:
                    stale[node.pos] = node

    @property
    def counts_decide(self) -> bool:
        """Whether, this cycle, a gang fits exactly when as many GPUs are free, whichever GPUs
        running jobs hold: GPUs chosen by count (a spread may take any of them), of one type,
        none cordoned, out of service or shared, in a cycle opened in full."""
        return (self.scheme == "count" and not self.in_place and not self.cordoned
                and not self._out and len(self._free_by_type) == 1 and not self._shared)

    def let_go(self, staying: Mapping[str, int]) -> dict[str, GpuSlots]:
        """In a walk where counts decide (`counts_decide`), once it is known which running
        jobs it re-places (`staying`, with their GPU counts): each of those is given back its
        own GPUs at once where `try_place` would keep them (returned), and every other
        running job the walk would have re-placed (bound, not kept yet) gives its GPUs up,
        free and no longer held, as if it had stopped; it is not placed again this cycle.
        What the walk then places lands on GPUs no staying job holds."""
        # Where `keep_all_but` has not held the walked jobs' GPUs yet, a staying job's stand
        # as they are: only those given up change.
        pending, self._pending = self._pending, None
        if pending is None:
            self._hold_all()
        settled = self._kept
        kept: dict[str, GpuSlots] = {}
        taken = 0
        for job_id in pending if pending is not None else self._bound_at:
            if job_id in settled:
                continue
            gpus = staying.get(job_id)
            if gpus is not None:
                slots = (self._keep(job_id, gpus, None) if pending is None
                         else self._keep_standing(job_id, gpus))
                if slots is not None:
                    kept[job_id] = slots
                    taken += gpus
                continue
            settled.add(job_id)
            self._give_up(job_id)
        self.placed.update(kept)
        self.free_gpus -= taken
        for gpu_type in self._free_by_type:  # one type: `counts_decide`
            self._free_by_type[gpu_type] -= taken
        return kept

    @property
    def idle_gpus(self) -> int:
        """Where counts decide: the GPUs no running job holds (in a cycle opened in full, a
        running job's count as free until a walk re-places it)."""
        return self._topo.total_gpus - self._busy_gpus

    def stay_but(self, running: Collection[str], given_up: AbstractSet[str]) -> bool:
        """Where counts decide, in a cycle opened in full that nothing has used yet, once a
        walk is known to re-place every running job but `given_up`: those stay where they
        run (a counted walk moves none of them: `let_go`), the given-up ones' GPUs are
        freed, and the cycle goes on as one opened in place with those jobs stopped. So it
        costs the jobs given up, not those that run. The same state `keep_all_but` and
        `let_go` reach, and refused (False, nothing done) where they would refuse: `running`
        not the jobs bound, or GPUs shared or gone but for given-up jobs."""
        if (not self._holding or self.placed or self._kept or self._only is not None
                or not self.counts_decide
                or self._bound.keys() != running or not self._lost <= given_up):
            return False
        self._holding = False
        self.in_place = True  # a staying job is not placed again (`_keep`)
        freed = sum(self._give_up(job_id) for job_id in given_up)
        self.free_gpus = self.idle_gpus + freed
        for gpu_type in self._free_by_type:  # one type: `counts_decide`
            self._free_by_type[gpu_type] = self.free_gpus
        return True

    def _give_up(self, job_id: str) -> int:
        """A running job's GPUs free and no longer held, as if it had stopped: how many."""
        freed = 0
        for node, m in self._bound_at[job_id] or ():
            node.free |= m
            node.held &= ~m
            freed += m.bit_count()
            self._moved(node)
        return freed

    def _keep_standing(self, job_id: str, gpus: int) -> GpuSlots | None:
        """`_keep` for a job whose GPUs are still taken as it runs (never held this cycle):
        it keeps them if they are its gang's count; else they are freed, as `_keep` leaves
        them, for it to be placed anew."""
        self._kept.add(job_id)
        at = self._bound_at[job_id]
        if at is not None and sum(m.bit_count() for _, m in at) == gpus:
            return self._bound[job_id]
        for node, m in at or ():
            node.free |= m
            self._moved(node)
        return None

    def _keep(self, job_id: str, gpus: int, gpu_type: str | None,
              within: Collection[str] | None = None) -> GpuSlots | None:
        """Give a running job back its own GPUs if they are all still free (and allowed)."""
        if (job_id not in self._bound or job_id in self._kept
                or (self._only is not None and job_id not in self._only)):
            return None
        if self.in_place:
            raise ValueError(f"job {job_id} runs in place this cycle: it is not placed again")
        self._kept.add(job_id)
        held = self._bound_at[job_id]
        if held is None:
            return None
        # One pass: un-hold every node of it (whatever happens next), check it can keep them.
        dirty, stale, out = self._dirty, self._stale if self._indexes else None, self._out
        kept, count = True, 0
        for node, m in held:
            node.held &= ~m
            dirty[node.pos] = node  # as `_moved`
            if stale is not None:
                stale[node.pos] = node
            if kept:
                # Its own GPUs out of service are still its own (they left the free pool).
                own = node.free | (out.get(node.pos, 0) & m) if out else node.free
                kept = (own & m == m and (gpu_type is None or node.gpu_type == gpu_type)
                        and (within is None or node.node_id in within))
                count += m.bit_count()
        if not kept or count != gpus:
            return None
        for node, m in held:
            node.free &= ~m
        return self._bound[job_id]

    def _consolidated(self, nodes: list[NodeGpus], switches: list[list[NodeGpus]], gpus: int,
                      displace: bool, index: FreeIndex | None) -> GpuSlots | None:
        """One node if a node of the switch is big enough, else whole nodes + a remainder."""
        if index is not None:
            self._flush()
            pos = (index.first if self.scheme == "yarn" else index.tightest)(gpus, displace)
            best = None if pos is None else self._nodes[pos]
        else:
            fits = [n for n in nodes if n.size >= gpus and n.available(displace) >= gpus]
            # tightest fit (`FreeIndex.tightest`); yarn: first fit in node order
            best = (None if not fits else fits[0] if self.scheme == "yarn"
                    else min(fits, key=lambda n: n.available(displace)))
        if best is not None:
            return ((best.node_id, best.take(gpus)),)
        wide = gpus > self._nodes[0].size if self._topo.uniform else None  # for every switch
        # Indexed, a switch without enough whole nodes is passed over unread.
        whole = None if index is None or not wide else index.whole(displace)
        need = gpus // self._nodes[0].size if whole is not None else 0
        for s, members in enumerate(switches):
            if whole is not None and whole[s] < need:
                continue
            if wide if wide is not None else all(n.size < gpus for n in members):
                slots = multi_node(members, gpus, displace, first_fit=self.scheme == "yarn")
                if slots is not None:
                    return slots
        return None

    def _fullest(self, index: FreeIndex, displace: bool) -> Iterator[NodeGpus]:
        """The pool's nodes with room, most first, as the index files them; read only when
        iterated (a spread over one switch never reads them)."""
        self._flush()
        nodes = self._nodes
        for pos in index.fullest(displace):
            yield nodes[pos]

    def _switch_free(self, index: FreeIndex | None, displace: bool) -> list[int] | None:
        """Each switch's available GPUs as the index keeps them (None: no index, or it keeps
        none; the spread then reads the nodes)."""
        if index is None:
            return None
        self._flush()
        return index.switch_free(displace)
