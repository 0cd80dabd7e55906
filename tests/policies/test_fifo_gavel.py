"""`fifo-gavel`: Gavel's base FIFO as its simulator runs it (policies/fifo_gavel.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from policies.fifo_gavel import FifoGavel
from policies.mechanisms.allocation import AllocationInput
from schemas.cluster import ClusterSpec
from tests.builders import make_job, simulate

TYPES = ("v100", "p100", "k80")  # the allocation's column order; Gavel draws in name order


def jobs(*specs: tuple[str, int, tuple[float, float, float]],
         free: tuple[float, float, float]) -> AllocationInput:
    """Jobs as (id, GPUs, rates on v100, p100, k80), in admission order; `free`: GPUs a type."""
    m = len(specs)
    return AllocationInput(
        job_ids=tuple(s[0] for s in specs), types=TYPES,
        throughputs=np.array([s[2] for s in specs], dtype=float).reshape(m, 3),
        gpus=np.array([s[1] for s in specs], dtype=float), weights=np.ones(m),
        remaining=np.full(m, 1000.0), age_s=np.zeros(m), capacity=np.array(free, dtype=float),
        prices=np.ones(3), deadline_s=np.full(m, np.inf), now=0.0)


def types_of(policy: FifoGavel, data: AllocationInput) -> dict[str, str | None]:
    x = policy.allocate(data)
    return {jid: (TYPES[int(np.argmax(row))] if row.any() else None)
            for jid, row in zip(data.job_ids, x, strict=True)}


def seeded(seed: int) -> FifoGavel:
    policy = FifoGavel()
    policy.configure(seed=seed, round_s=360.0)
    return policy


def seed_drawing(first: int, of: int) -> int:
    """A seed whose first draw among `of` types is `first`."""
    return next(s for s in range(1000) if random.Random(s).randrange(of) == first)


ALL = (1.0, 1.0, 1.0)


@pytest.mark.parametrize(("data", "expected"), [
    # the alphabetically last type with a free GPU, whatever the draw: v100
    (jobs(("a", 1, ALL), free=(4, 4, 4)), {"a": "v100"}),
    # v100 full: p100 is the last free type
    (jobs(("a", 1, ALL), free=(0, 4, 4)), {"a": "p100"}),
    # v100 has one GPU, too few for a 2-GPU job: it goes there all the same (over-committed)
    (jobs(("a", 2, ALL), free=(1, 0, 4)), {"a": "v100"}),
    # no type with room for the head: nobody overtakes it
    (jobs(("a", 8, ALL), ("b", 1, ALL), free=(4, 4, 4)), {"a": None, "b": None}),
    # a job that cannot run on the slipped type is passed over; the next one goes on
    (jobs(("a", 1, (0.0, 1.0, 1.0)), ("b", 1, ALL), free=(4, 4, 4)), {"a": None, "b": "v100"}),
])
def test_the_type_a_new_job_gets(data: AllocationInput, expected: dict[str, str | None]) -> None:
    assert types_of(seeded(0), data) == expected


@pytest.mark.parametrize(("drawn", "second"), [(0, None), (1, "k80")])
def test_a_full_type_leaves_the_list_by_the_drawn_index(drawn: int, second: str | None) -> None:
    # One v100 and one k80 free. The first job takes the v100 (the slip), filling it; the list
    # [k80, v100] then loses the entry at the drawn index. Drawn 0: the k80 goes, the full
    # v100 stays, and the second job finds no room. Drawn 1: the v100 goes; the second job
    # takes the k80.
    data = jobs(("a", 1, ALL), ("b", 1, ALL), free=(1, 0, 1))
    assert types_of(seeded(seed_drawing(drawn, 2)), data) == {"a": "v100", "b": second}


def test_a_finished_job_hands_its_type_to_the_queue_head_without_a_draw() -> None:
    policy = seeded(0)
    first = jobs(("a", 1, ALL), ("b", 4, ALL), free=(0, 0, 4))
    assert types_of(policy, first) == {"a": "k80", "b": None}  # b waits: 3 k80s left
    state = policy._rng.getstate()
    # a finished; v100s came free meanwhile, but b takes a's type, the k80, at once
    later = jobs(("b", 4, ALL), ("c", 1, ALL), free=(4, 0, 4))
    assert types_of(policy, later) == {"b": "k80", "c": "v100"}
    # the one draw taken was c's
    rng = random.Random()
    rng.setstate(state)
    rng.randrange(1)
    assert policy._rng.getstate() == rng.getstate()


def test_running_jobs_keep_their_types() -> None:
    policy = seeded(0)
    data = jobs(("a", 1, ALL), ("b", 1, ALL), free=(4, 4, 4))
    assert types_of(policy, data) == types_of(policy, data) == {"a": "v100", "b": "v100"}


def test_every_job_finishes_in_a_simulation() -> None:
    # Over-committed types must not starve anyone: the rounds run the allocated jobs that fit.
    specs = [make_job(f"j{i}").gpus(1 + i % 2).rates(v100=2.0, p100=1.5, k80=1.0)
             .iterations(400 + 50 * i).submit(30.0 * i).build() for i in range(12)]
    cluster = ClusterSpec.heterogeneous({"v100": 2, "p100": 2, "k80": 2}, 2)
    result = simulate(specs, "fifo-gavel", cluster, round_s=360.0)
    assert result.summary["finished"] == 12
    assert result.summary["errors"] == 0
