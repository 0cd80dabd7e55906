"""Small random traces for the simulated nodes' equivalence properties: jobs of a few sizes,
some submitted as identical copies at one instant (so runs finish at the same time)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from schemas.job import JobSpec
from tests.builders import make_job

Row = tuple[int, int, int, int]  # GPUs, seconds of work, submission, copies


def rows(sizes: Sequence[int] = (1, 1, 2, 4, 8)) -> st.SearchStrategy[list[Row]]:
    return st.lists(st.tuples(st.sampled_from(sizes), st.integers(1, 3000),
                              st.integers(0, 2000), st.integers(1, 3)),
                    min_size=1, max_size=25)


def jobs(trace: list[Row]) -> list[JobSpec]:
    return [make_job(f"j{i:02d}c{k}").gpus(g).runs_for(s).submit(t).build()
            for i, (g, s, t, copies) in enumerate(trace) for k in range(copies)]
