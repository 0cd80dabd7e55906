"""Gavel's base FIFO as its simulator runs it (stanford-futuredata/gavel c4fa400,
`scheduler/policies/fifo.py`), to compare with Gavel's own figures like for like;
`fifo-random` is the policy as Gavel describes it.

Three things the simulator does that the description does not say:
- Each finished job hands its GPU type to the head of the queue first, in job order, if the
  head fits in the GPUs counted free so far (the running jobs after it in that order are not
  yet counted) and runs on the type.
- The random draw picks an index among the types with room for the job, but the job gets
  `worker_type`, the name its loop over the list of free types (sorted by name, made before
  the queue is walked) left behind: the last type on that list, room or not. So jobs pile onto
  that type past its GPUs, and the rounds run those that fit.
- A type leaves the list when its count reaches exactly zero, and then the list loses the
  entry at the drawn index, whatever type that is.
Draws are taken as Gavel takes them (one per job the loop reaches), from the run's seed.
"""

from __future__ import annotations

import itertools

import numpy as np

from policies.fifo_rounds import FifoRandom
from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import FloatArray


class FifoGavel(FifoRandom):
    name = "fifo-gavel"
    description = ("Gavel FIFO as its simulator (c4fa400) runs it: finished jobs' types go to "
                   "the queue's head; its type draw's slip")

    def __init__(self) -> None:
        super().__init__()
        # The last allocation's rows (admission order, Gavel's job id order): every job
        # assigned a type was in it, finished or not.
        self._last_row: dict[str, int] = {}

    def allocate(self, inp: AllocationInput) -> FloatArray:
        row = {jid: i for i, jid in enumerate(inp.job_ids)}
        free = dict(zip(inp.types, inp.capacity.tolist(), strict=True))
        queue = [jid for jid in inp.job_ids if jid not in self._assigned]
        head = 0
        kept: dict[str, str] = {}
        for jid in sorted(self._assigned, key=self._last_row.__getitem__):
            gpu_type = self._assigned[jid]
            if jid in row:  # still running: its GPUs are counted now
                kept[jid] = gpu_type
                free[gpu_type] -= inp.gpus[row[jid]]
            elif head < len(queue) and self._runs(inp, row[queue[head]], gpu_type, free):
                kept[queue[head]] = gpu_type
                free[gpu_type] -= inp.gpus[row[queue[head]]]
                head += 1
        types = sorted(t for t in free if free[t] > 0)
        for jid in itertools.islice(queue, head, None):
            if not types:
                break
            i = row[jid]
            room = [k for k, t in enumerate(types) if free[t] >= inp.gpus[i]]
            if not room:
                break  # FIFO: nobody overtakes the head of the queue
            drawn = self._rng.randrange(len(room))
            gpu_type = types[-1]  # not types[room[drawn]]: Gavel's shadowed loop variable
            if inp.throughputs[i, inp.types.index(gpu_type)] > 0:
                kept[jid] = gpu_type
                free[gpu_type] -= inp.gpus[i]
                if free[gpu_type] == 0:
                    types.pop(room[drawn])
        self._assigned, self._last_row = kept, row
        x = np.zeros(inp.shape)
        for jid, gpu_type in kept.items():
            x[row[jid], inp.types.index(gpu_type)] = 1.0
        return x

    @staticmethod
    def _runs(inp: AllocationInput, i: int, gpu_type: str, free: dict[str, float]) -> bool:
        """Whether job `i` fits in `gpu_type`'s GPUs counted free so far and runs there."""
        return bool(inp.gpus[i] <= free[gpu_type]
                    and inp.throughputs[i, inp.types.index(gpu_type)] > 0)
