"""Prometheus exposition of the metrics core (prometheus-client), read at scrape time.

A custom collector reads `MetricsCore` when Prometheus scrapes, so the core stays a plain
deterministic state machine with no client-library counters to keep in step. Names follow
Prometheus conventions: `loom_` prefix, base units in the name, counters end in `_total`.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import generate_latest, start_http_server
from prometheus_client.registry import Collector

from domain.health import verdict
from schemas.causes import FAULT_KINDS
from schemas.cluster import ClusterSpec
from schemas.job import JobState
from schemas.queues import ANY_TYPE
from services.metrics.core import MetricsCore
from services.metrics.stream_usage import StreamUsage

# Seconds: a minute to a week, roughly ×3 apart (training jobs, not requests).
DURATION_BUCKETS = (60.0, 180.0, 600.0, 1800.0, 3600.0, 3 * 3600.0, 10 * 3600.0, 86400.0,
                    3 * 86400.0, 7 * 86400.0)


# Forecast errors run from exact (a simulation with no later arrivals) to days.
FORECAST_BUCKETS = (1.0, 10.0, *DURATION_BUCKETS)


def histogram(name: str, doc: str, values: Sequence[float],
              bounds: Sequence[float] = DURATION_BUCKETS) -> HistogramMetricFamily:
    ordered = sorted(values)
    buckets = [(_le(b), float(bisect.bisect_right(ordered, b))) for b in bounds]
    buckets.append(("+Inf", float(len(ordered))))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=sum(ordered))


def _le(bound: float) -> str:
    return f"{bound:g}" if bound < 1e6 else repr(bound)


class MetricsCollector(Collector):
    def __init__(self, core: MetricsCore, cluster: ClusterSpec) -> None:
        self.core = core
        self.cluster = cluster

    def collect(self) -> Iterator[Any]:
        core = self.core
        by_state = Counter(j.state for j in core.jobs.values())
        jobs = GaugeMetricFamily("loom_jobs", "Jobs by lifecycle state", labels=["state"])
        for state in JobState:
            # Rejections of invalid submissions have no job record; the core counts them all.
            count = core.rejected if state is JobState.REJECTED else by_state.get(state, 0)
            jobs.add_metric([state.value], count)
        yield jobs
        yield histogram("loom_job_completion_seconds", "Job completion time (submit to end)",
                        [j.jct_s for j in core.jobs.values() if j.jct_s is not None])
        yield histogram("loom_job_queueing_seconds", "Delay from submission to first start",
                        [j.queueing_s for j in core.jobs.values() if j.queueing_s is not None])
        busy = Counter(node for node, _ in core.busy_gpus())
        util = GaugeMetricFamily("loom_node_gpu_utilization_ratio",
                                 "Share of a node's GPUs held by running jobs", labels=["node"])
        for node in self.cluster.nodes:
            util.add_metric([node.node_id], busy.get(node.node_id, 0) / node.gpus
                            if node.gpus else 0.0)
        yield util
        gpu_util = GaugeMetricFamily("loom_gpu_utilization_ratio",
                                     "GPU busy share as the node agent last measured it",
                                     labels=["node", "gpu"])
        gpu_mem = GaugeMetricFamily("loom_gpu_memory_used_bytes",
                                    "GPU memory in use as the node agent last measured it",
                                    labels=["node", "gpu"])
        seen = GaugeMetricFamily("loom_node_last_heartbeat_seconds",
                                 "Cluster time of the node agent's latest heartbeat",
                                 labels=["node"])
        for node_id, (at, beat) in sorted(core.heartbeats.items()):
            seen.add_metric([node_id], at)
            for sample in beat.gpus:
                gpu_util.add_metric([node_id, sample.uuid], sample.utilization_ratio)
                gpu_mem.add_metric([node_id, sample.uuid], sample.memory_used_bytes)
        yield gpu_util
        yield gpu_mem
        yield seen
        yield from self._health()
        yield from self._queues()
        yield CounterMetricFamily("loom_gpu_busy_seconds_total",
                                  "GPU-seconds held by running jobs (cluster time)",
                                  value=core.busy_gpu_s)
        faults = CounterMetricFamily("loom_job_faults_total",
                                     "Jobs requeued off a lost or restarted node, launches "
                                     "refused or never started, and trainer failures (each "
                                     "retry and each final failure)",
                                     labels=["kind"])
        for kind in FAULT_KINDS:
            faults.add_metric([kind], core.faults.get(kind, 0))
        yield faults
        yield CounterMetricFamily("loom_decisions_total",
                                  "Scheduler transitions and plans recorded",
                                  value=core.decisions)
        # The scheduler's start forecasts (`forecast_every_s`), each scored by how far it was
        # from its job's next start (services.metrics.forecasts); empty while they are off.
        yield histogram("loom_start_forecast_error_seconds",
                        "|forecast - actual start| of each start forecast made while a job "
                        "waited, scored when it started", core.forecasts.errors,
                        FORECAST_BUCKETS)


    def _queues(self) -> Iterator[Any]:
        """The queues as the scheduler last published them (`loom.sched.queues`, docs/queues.md
        "Operator view"); no series without queues. `gpu_type` is empty for quotas of GPUs of
        any type, `cohort` for a queue in none."""
        board = self.core.queues
        per_type = ["queue", "cohort", "gpu_type"]
        gauges = {
            "nominal": GaugeMetricFamily("loom_queue_nominal_gpus", "A queue's nominal quota",
                                         labels=per_type),
            "used": GaugeMetricFamily("loom_queue_used_gpus",
                                      "GPUs a queue's running jobs hold", labels=per_type),
            "borrowed": GaugeMetricFamily("loom_queue_borrowed_gpus",
                                          "GPUs a queue holds beyond its nominal quota",
                                          labels=per_type),
            "lent": GaugeMetricFamily("loom_queue_lent_gpus", "A queue's nominal quota that "
                                      "other queues of its cohort hold (their borrowing, "
                                      "split between lenders by idle quota)", labels=per_type),
        }
        limit = GaugeMetricFamily("loom_queue_borrowing_limit_gpus", "The most a queue may "
                                  "borrow beyond its nominal quota (absent: no limit)",
                                  labels=per_type)
        per_queue = ["queue", "cohort"]
        pending = GaugeMetricFamily("loom_queue_pending_jobs", "A queue's waiting jobs "
                                    "(queued, preempted or suspended)", labels=per_queue)
        pending_gpus = GaugeMetricFamily("loom_queue_pending_gpus",
                                         "GPUs a queue's waiting jobs ask for", labels=per_queue)
        running = GaugeMetricFamily("loom_queue_running_jobs", "A queue's running jobs",
                                    labels=per_queue)
        usage = GaugeMetricFamily("loom_queue_usage_gpu_seconds", "A queue's decayed GPU "
                                  "usage (fair share: less per weight ranks first)",
                                  labels=per_queue)
        rank = GaugeMetricFamily("loom_queue_fair_share_rank", "A queue's place in its "
                                 "cohort's order for borrowed GPUs (1: first)", labels=per_queue)
        waiting = GaugeMetricFamily("loom_queue_waiting_jobs", "A queue's waiting jobs by the "
                                    "reason code `loom status` gives", labels=[*per_queue, "code"])
        for row in board.rows.values():
            cohort = row.cohort or ""
            for quota in row.quotas:
                labels = [row.name, cohort, "" if quota.gpu_type == ANY_TYPE else quota.gpu_type]
                for what, gauge in gauges.items():
                    gauge.add_metric(labels, getattr(quota, what))
                if quota.borrowing_limit is not None:
                    limit.add_metric(labels, quota.borrowing_limit)
            pending.add_metric([row.name, cohort], row.pending_jobs)
            pending_gpus.add_metric([row.name, cohort], row.pending_gpus)
            running.add_metric([row.name, cohort], row.running_jobs)
            usage.add_metric([row.name, cohort], row.usage_gpu_s)
            if row.rank is not None:
                rank.add_metric([row.name, cohort], row.rank)
            for w in row.waiting:
                waiting.add_metric([row.name, cohort, w.code.value], w.jobs)
        yield from gauges.values()
        yield limit
        yield pending
        yield pending_gpus
        yield running
        yield usage
        yield rank
        yield waiting
        reclaims = CounterMetricFamily("loom_queue_reclaims_total", "Jobs of a queue preempted "
                                       "because a lender took back the quota it had borrowed",
                                       labels=per_queue)
        for name, count in board.reclaims().items():
            reclaims.add_metric([name, board.rows[name].cohort or ""], count)
        yield reclaims

    def _health(self) -> Iterator[Any]:
        """What each node's latest heartbeat says of its health, by the rule the scheduler
        cordons by (`domain.health`); `gpu` is the GPU's index on its node."""
        sizes = {n.node_id: n.gpus for n in self.cluster.nodes}
        cordoned = GaugeMetricFamily(
            "loom_node_health_cordoned", "1 while a check of the node itself fails: the "
            "scheduler cordons it (no new work)", labels=["node"])
        out = GaugeMetricFamily(
            "loom_gpu_out_of_service", "1 while a check of this GPU fails (ECC, XID, row "
            "remap, temperature, lost): it takes no new work", labels=["node", "gpu"])
        problems = GaugeMetricFamily(
            "loom_node_health_problem", "1 per health check that warns or fails, by check "
            "(docs/doctor.md); gpu is empty for the node's own checks",
            labels=["node", "check", "gpu", "status"])
        for node_id, (_, beat) in sorted(self.core.heartbeats.items()):
            if beat.health is None:
                continue
            try:
                found = verdict(beat.health, sizes.get(node_id, 0))
            except ValueError:
                continue  # the scheduler refuses such a report; so do we
            cordoned.add_metric([node_id], 0.0 if found.node is None else 1.0)
            for gpu in found.gpus:
                out.add_metric([node_id, str(gpu)], 1.0)
            for p in beat.health.problems:
                problems.add_metric([node_id, p.check, "" if p.gpu is None else str(p.gpu),
                                     p.status], 1.0)
        yield cordoned
        yield out
        yield problems


class StreamCollector(Collector):
    """The streams' fill as `StreamWatch` last polled it (`usage`: stream → its usage)."""

    def __init__(self, usage: Mapping[str, StreamUsage]) -> None:
        self.usage = usage

    def collect(self) -> Iterator[Any]:
        stored = GaugeMetricFamily("loom_stream_bytes", "Bytes a JetStream stream holds",
                                   labels=["stream"])
        limit = GaugeMetricFamily("loom_stream_max_bytes",
                                  "A stream's max_bytes (-1: no limit)", labels=["stream"])
        count = GaugeMetricFamily("loom_stream_messages", "Messages a stream holds",
                                  labels=["stream"])
        for name, u in sorted(self.usage.items()):
            stored.add_metric([name], u.bytes)
            limit.add_metric([name], u.max_bytes)
            count.add_metric([name], u.messages)
        yield stored
        yield limit
        yield count


def registry_for(core: MetricsCore, cluster: ClusterSpec,
                 streams: Mapping[str, StreamUsage] | None = None) -> CollectorRegistry:
    """`streams`: the live streams' usage (`StreamWatch.latest`), exported when given."""
    registry = CollectorRegistry()
    registry.register(MetricsCollector(core, cluster))
    if streams is not None:
        registry.register(StreamCollector(streams))
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """The text a scrape returns (for tests and `loom status --metrics`)."""
    return generate_latest(registry).decode()


def serve_http(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve /metrics on addr:port in a thread; returns the server (call .shutdown())."""
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
