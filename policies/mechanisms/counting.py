"""A counted walk that costs the jobs it changes, not the jobs that run.

Where counts decide (`Fitter.counts_decide`), a walk places a job exactly when, at its turn,
at least its GPU count is left (`greedy_fill`'s counted walk). With every running job's rank
known and kept sorted across cycles, most of that walk need not be read. Call `slack` the
GPUs left minus those of the running jobs not walked yet: it starts at the idle GPUs, falls
by what each waiting job takes and rises by what each running job given up holds, and a
running job that stays leaves it as it was. A running job's turn leaves it `slack` plus its
own GPUs and those of every running job behind it; so while `slack` plus the GPUs of the
running jobs at the end of the order (the "tail") is not negative, every running job ahead
of the tail stays. The walk therefore decides one by one only the waiting jobs it reaches
and the running jobs of the tail, which it grows backward only as far as that sum needs:
about the GPUs the waiting jobs take beyond the idle ones.

It assumes what a walk over one GPU type can: every running job may run on that type (it
runs there), and holds its gang's GPU count.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from sortedcontainers import SortedList

from policies.base import Fitter, JobView
from policies.mechanisms.walk import Stream, merge_heads, typed_fits
from schemas.job import JobSpec

__all__ = ["count_walk"]


class _Tail:
    """The running jobs at the end of the order (`order[start:]`), read backward from it, and
    the GPUs each holds with every one behind it (`from_`)."""

    def __init__(self, order: SortedList, gpus_of: Callable[[str], int]) -> None:
        self.order, self.gpus_of = order, gpus_of
        self.start = len(order)
        self._sums: list[int] = [0]  # _sums[k]: the GPUs of the last k running jobs

    @property
    def gpus(self) -> int:
        return self._sums[-1]

    def grow(self) -> None:
        self.start -= 1
        self._sums.append(self._sums[-1] + self.gpus_of(self.order[self.start][1]))

    def from_(self, i: int) -> int:
        """The GPUs of the running jobs `order[i:]` (`i` in the tail or at its end)."""
        return self._sums[len(self.order) - i]


def count_walk(order: SortedList, gpus_of: Callable[[str], int], waiting: list[Stream],
               jobs: Mapping[str, JobView], fit: Fitter
               ) -> tuple[list[tuple[str, int, JobSpec]], set[str]]:
    """The counted walk over the running jobs (`order`: every one's rank, sorted; `gpus_of`
    a running job's GPU count) and the `waiting` streams (each sorted, of one GPU count), in
    a cycle opened in full that nothing has used: the waiting jobs it starts (in walk order,
    with their GPU counts and specs), and the running jobs it gives up. Every other running
    job stays where it runs."""
    tail = _Tail(order, gpus_of)
    slack = fit.idle_gpus
    given_up: set[str] = set()
    walked = 0  # order[:walked] decided

    def walk_to(end: int) -> None:
        """Decide the running jobs `order[walked:end]`: those ahead of the tail stay (each
        finds its own GPUs and the tail's left: `slack + tail.gpus` is not negative, as the
        waiting jobs' turns below leave it where the tail does not reach them), and those
        in it are decided one by one."""
        nonlocal slack, walked
        assert slack + tail.gpus >= 0 or tail.start <= walked
        for i in range(max(walked, tail.start), end):
            rest = tail.from_(i)
            gpus = rest - tail.from_(i + 1)
            if gpus > slack + rest:
                slack += gpus
                given_up.add(order[i][1])
        walked = max(walked, end)

    starting: list[tuple[str, int, JobSpec]] = []
    heads = merge_heads(waiting)
    while heads:
        rank = heapq.heappop(heads)
        size, items = waiting[rank[2]]
        assert size is not None, "waiting streams are of one GPU count each"
        at = order.bisect_left(rank[:2])
        walk_to(at)
        while slack + tail.gpus < size and tail.start > at:  # take it, slack stays covered
            tail.grow()
        left = slack + (tail.from_(at) if at >= tail.start else tail.gpus)  # exact, or enough
        if size > left:
            continue  # nothing in this stream can fit any more
        spec = jobs[rank[1]].spec
        if spec.throughputs is None or typed_fits(fit, spec):
            slack -= size
            starting.append((rank[1], size, spec))
        nxt = next(items, None)
        if nxt is not None:
            heapq.heappush(heads, (nxt[0], nxt[1], rank[2]))
    walk_to(len(order))
    return starting, given_up
