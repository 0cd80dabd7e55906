"""The `loom_queue_*` series: fed by the scheduler's published queue status and its reclaim
transitions, as a live metrics service hears them."""

from __future__ import annotations

from itertools import count

import policies
from schemas.cluster import ClusterSpec
from schemas.events import envelope
from schemas.job import JobSpec, SubmitJob
from schemas.queue_status import QueueState, QueueStatus, QuotaUsage
from schemas.tenants import TenantsConfig
from services.metrics.core import MetricsCore
from services.metrics.prometheus import exposition, registry_for
from services.runtime.effects import Effect, Publish
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from tests.builders import cluster
from tests.policies.mechanisms.queue_fixtures import job, queues
from tests.services.metrics.test_prometheus import samples

_ids = count()


class Wire:
    """A scheduler publishing its queues' status and a metrics core hearing what it says."""

    def __init__(self, tenants: TenantsConfig, cl: ClusterSpec) -> None:
        self.cl = cl
        self.sched = SchedulerCore(cl, policies.make("fifo"),
                                   SchedulerConfig(tenants=tenants, queue_status_every_s=0.0))
        self.metrics = MetricsCore(cl.total_gpus)

    def deliver(self, effects: list[Effect], now: float) -> None:
        heard = {s.subject for s in self.metrics.subscriptions()}
        for e in effects:
            if isinstance(e, Publish) and e.subject in heard:
                self.metrics.handle(envelope(e.body, event_id=f"m{next(_ids)}",
                                             occurred_at=now, producer="scheduler",
                                             causation_id=None), now)

    def run(self, jobs: list[JobSpec], now: float) -> None:
        for spec in jobs:
            self.deliver(self.sched.handle(envelope(
                SubmitJob.from_spec(spec), event_id=f"s{next(_ids)}", occurred_at=now,
                producer="test", causation_id=None), now), now)
        self.deliver(self.sched.on_timer("cycle", now), now)

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(exposition(registry_for(self.metrics, self.cl)))


def series(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
           ) -> dict[tuple[str, ...], float]:
    """name's samples by their label values, in label-name order."""
    return {tuple(v for _, v in labels): value for (n, labels), value in got.items()
            if n == name}


def test_borrowing_lending_pending_and_reclaims_per_queue() -> None:
    wire = Wire(queues(a={"nominal": 4, "borrowing_limit": 4}, b={"nominal": 4}), cluster(2, 4))
    wire.run([job(f"a{i}", "a") for i in range(9)], 0.0)
    got = wire.scrape()
    # labels sorted by name: cohort, gpu_type, queue
    assert series(got, "loom_queue_nominal_gpus") == {("c", "", "a"): 4, ("c", "", "b"): 4}
    assert series(got, "loom_queue_used_gpus") == {("c", "", "a"): 8, ("c", "", "b"): 0}
    assert series(got, "loom_queue_borrowed_gpus") == {("c", "", "a"): 4, ("c", "", "b"): 0}
    assert series(got, "loom_queue_lent_gpus") == {("c", "", "a"): 0, ("c", "", "b"): 4}
    assert series(got, "loom_queue_borrowing_limit_gpus") == {("c", "", "a"): 4}
    assert series(got, "loom_queue_pending_jobs") == {("c", "a"): 1, ("c", "b"): 0}
    assert series(got, "loom_queue_running_jobs") == {("c", "a"): 8, ("c", "b"): 0}
    # code, cohort, queue
    assert series(got, "loom_queue_waiting_jobs") == {("borrowing_limit", "c", "a"): 1}
    assert series(got, "loom_queue_reclaims_total") == {("c", "a"): 0, ("c", "b"): 0}

    wire.run([job("b0", "b", 3)], 50.0)  # b takes 3 of its 4 back: a's jobs are reclaimed
    got = wire.scrape()
    assert series(got, "loom_queue_reclaims_total") == {("c", "a"): 3, ("c", "b"): 0}
    assert series(got, "loom_queue_used_gpus") == {("c", "", "a"): 5, ("c", "", "b"): 3}
    assert series(got, "loom_queue_lent_gpus") == {("c", "", "a"): 0, ("c", "", "b"): 1}
    assert series(got, "loom_queue_pending_jobs") == {("c", "a"): 4, ("c", "b"): 0}
    usage = series(got, "loom_queue_usage_gpu_seconds")
    assert usage[("c", "a")] > usage[("c", "b")] == 0.0
    assert series(got, "loom_queue_fair_share_rank") == {("c", "a"): 2, ("c", "b"): 1}


def test_typed_quotas_have_a_series_per_gpu_type() -> None:
    hetero = ClusterSpec.heterogeneous({"a100": 4, "v100": 4}, 4)
    wire = Wire(queues(a={"nominal": {"a100": 2, "v100": 2}}, b={"nominal": {"a100": 2}}),
                hetero)
    wire.run([job(f"a{i}", "a", 1, "a100") for i in range(3)], 0.0)
    got = wire.scrape()
    assert series(got, "loom_queue_used_gpus") == {
        ("c", "a100", "a"): 3, ("c", "v100", "a"): 0, ("c", "a100", "b"): 0}
    assert series(got, "loom_queue_lent_gpus")[("c", "a100", "b")] == 1


def row(name: str, used: int) -> QueueState:
    return QueueState(name=name, quotas=(QuotaUsage(gpu_type="*", nominal=4, used=used),))


def test_parts_add_up_and_a_late_older_status_is_ignored() -> None:
    m = MetricsCore(8)

    def hear(body: QueueStatus) -> None:
        m.handle(envelope(body, event_id=f"p{next(_ids)}", occurred_at=body.at,
                          producer="scheduler", causation_id=None), body.at)

    hear(QueueStatus(at=10.0, cycle=2, tenants_file=True, queues=(row("a", 1),), parts=2))
    hear(QueueStatus(at=10.0, cycle=2, tenants_file=True, queues=(row("b", 2),), part=1,
                     parts=2))
    hear(QueueStatus(at=5.0, cycle=1, tenants_file=True, queues=(row("a", 4),)))
    got = samples(exposition(registry_for(m, cluster(2, 4))))
    assert series(got, "loom_queue_used_gpus") == {("", "", "a"): 1, ("", "", "b"): 2}
    assert m.decisions == 0  # observations: outside the decision count and digest
    # A scheduler restarted with a file without queue b: b's series go.
    hear(QueueStatus(at=20.0, cycle=1, tenants_file=True, queues=(row("a", 3),)))
    got = samples(exposition(registry_for(m, cluster(2, 4))))
    assert series(got, "loom_queue_used_gpus") == {("", "", "a"): 3}


def test_no_queue_series_without_queues() -> None:
    got = samples(exposition(registry_for(MetricsCore(8), cluster(2, 4))))
    assert not [name for name, _ in got if name.startswith("loom_queue_")]
