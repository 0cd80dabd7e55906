"""Properties of the queue layer on random small clusters, queues and jobs, over several cycles
walked in random orders (any policy's order): no queue ever holds more than its nominal quota
plus its borrowing limit, and the cohort's pool is never overdrawn, so no lender lends beyond
its lending limit (policies.mechanisms.quota)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.mechanisms.quota import Book
from schemas.job import JobSpec
from schemas.tenants import TenantsConfig
from tests.builders import cluster
from tests.policies.mechanisms.queue_fixtures import Cycle, job, queue_file

CLUSTERS = [cluster(2, 4), cluster(1, 8), cluster(3, 2)]
NAMES = ["a", "b", "c"]


@st.composite
def configs(draw: st.DrawFn) -> TenantsConfig:
    specs: dict[str, dict[str, Any]] = {}
    for name in NAMES[:draw(st.integers(2, 3))]:
        nominal = draw(st.integers(0, 6))
        spec: dict[str, Any] = {"nominal": nominal, "weight": draw(st.sampled_from([1, 2])),
                                "priority": draw(st.integers(0, 1)),
                                "min_runtime_s": draw(st.sampled_from([0, 50])),
                                "reclaim": draw(st.sampled_from(["any", "lower_priority"]))}
        if draw(st.booleans()):
            spec["borrowing_limit"] = draw(st.integers(0, 4))
        if draw(st.booleans()):
            spec["lending_limit"] = draw(st.integers(0, nominal))
        specs[name] = spec
    return queue_file(specs)


def check(book: Book, held: dict[str, int]) -> list[str]:
    found = []
    drawn = pool = 0
    for q, spec in book.config.queues.items():
        most = spec.nominal_of("*") + (spec.borrowing_of("*") or 10**6)
        if held.get(q, 0) > most:
            found.append(f"queue {q} holds {held[q]} > nominal + borrowing limit {most}")
        drawn += book.pool_part(q, "*", held.get(q, 0))
        pool += spec.lendable_of("*")
    if drawn > pool:
        found.append(f"pool overdrawn: {drawn} of {pool} ({held})")
    return found


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), where=st.integers(0, len(CLUSTERS) - 1), data=st.data())
def test_quotas_hold_over_random_cycles(config: TenantsConfig, where: int,
                                        data: st.DataObject) -> None:
    book = Book.of(config)
    running: list[tuple[JobSpec, float]] = []  # (job, when its run began)
    backlog: list[JobSpec] = []  # waiting, from earlier cycles
    now, n = 0.0, 0
    for _ in range(4):
        for _ in range(data.draw(st.integers(0, 6))):
            q = data.draw(st.sampled_from(list(config.queues)))
            backlog.append(job(f"j{n}", q, data.draw(st.sampled_from([1, 1, 2, 4]))))
            n += 1
        cycle = Cycle(config, running=running, waiting=backlog, now=now, cl=CLUSTERS[where])
        specs = {s.job_id: s for s, _ in running} | {s.job_id: s for s in backlog}
        cycle.order = data.draw(st.permutations(list(specs)))  # any policy's walk
        placed, gate = cycle.walk()
        held: dict[str, int] = {}
        for jid in placed:
            q = book.queue_of[specs[jid].tenant]
            held[q] = held.get(q, 0) + specs[jid].gpus
        assert check(book, held) == []
        assert not set(placed) & set(gate.reclaimed)
        # Some runs end; what was not placed (preempted ones too) waits for the next cycle.
        started = {s.job_id: t for s, t in running}
        running = [(specs[j], started.get(j, now)) for j in placed if data.draw(st.booleans())]
        backlog = [specs[j] for j in specs if j not in placed]
        now += 30.0
