"""The Prometheus view of the metrics core: what a scrape returns, and over HTTP."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.events import GpuSample, JobTransitionV1, NodeHeartbeat, envelope
from schemas.job import JobState
from services.metrics.core import MetricsCore
from services.metrics.prometheus import exposition, histogram, registry_for, serve_http
from services.runtime.natsserver import free_port
from tests.builders import cluster, make_job

Q, R, F, J = JobState.QUEUED, JobState.RUNNING, JobState.FINISHED, JobState.REJECTED


def feed(m: MetricsCore, t: float, tr: JobTransitionV1) -> None:
    m.handle(envelope(tr, event_id=f"e{t}{tr.job_id}{tr.state}", occurred_at=t,
                      producer="scheduler", causation_id=None), t)


def scripted() -> MetricsCore:
    """a: 2 GPUs on n0, 100 s queued, runs 500 s; b: 4 GPUs on n1, still running; c rejected."""
    m = MetricsCore(8)
    a = make_job("a").gpus(2).submit(0).build()
    b = make_job("b").gpus(4).submit(0).build()
    c = make_job("c").gpus(2).submit(0).build()
    feed(m, 0, JobTransitionV1(job_id="a", state=Q, previous=None, cause="x", spec=a))
    feed(m, 0, JobTransitionV1(job_id="b", state=Q, previous=None, cause="x", spec=b))
    feed(m, 0, JobTransitionV1(job_id="c", state=J, previous=None, cause="x", spec=c))
    feed(m, 100, JobTransitionV1(job_id="a", state=R, previous=Q, cause="x",
                               placement=(("n0", (0, 1)),)))
    feed(m, 100, JobTransitionV1(job_id="b", state=R, previous=Q, cause="x",
                               placement=(("n1", (0, 1, 2, 3)),)))
    feed(m, 600, JobTransitionV1(job_id="a", state=F, previous=R, cause="x"))
    return m


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_a_scrape_reports_jobs_jcts_queueing_and_node_utilisation() -> None:
    got = samples(exposition(registry_for(scripted(), cluster(2, 4))))
    assert got[("loom_jobs", (("state", "finished"),))] == 1
    assert got[("loom_jobs", (("state", "running"),))] == 1
    assert got[("loom_jobs", (("state", "rejected"),))] == 1
    assert got[("loom_jobs", (("state", "queued"),))] == 0
    assert got[("loom_job_completion_seconds_count", ())] == 1
    assert got[("loom_job_completion_seconds_sum", ())] == 600
    assert got[("loom_job_completion_seconds_bucket", (("le", "600"),))] == 1
    assert got[("loom_job_completion_seconds_bucket", (("le", "180"),))] == 0
    assert got[("loom_job_queueing_seconds_sum", ())] == 200  # a and b waited 100 s each
    nodes = {n.node_id for n in cluster(2, 4).nodes}
    util = {dict(k[1])["node"]: v for k, v in got.items()
            if k[0] == "loom_node_gpu_utilization_ratio"}
    assert set(util) == nodes
    assert sorted(util.values()) == [0.0, 1.0]  # a's node is free again, b holds all of its


@pytest.mark.parametrize(("values", "counts"), [
    ([], [0] * 11),
    ([59.0, 60.0, 61.0], [2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]),
    ([1e7], [0] * 10 + [1]),
])
def test_histogram_buckets_are_cumulative(values: list[float], counts: list[int]) -> None:
    fam = histogram("x_seconds", "x", values)
    buckets = [s.value for s in fam.samples if s.name == "x_seconds_bucket"]
    assert buckets == counts


def test_the_endpoint_serves_the_same_text_over_http() -> None:
    port = free_port()
    server = serve_http(registry_for(scripted(), cluster(2, 4)), port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
    assert samples(text)[("loom_jobs", (("state", "finished"),))] == 1


def test_heartbeats_become_per_gpu_gauges_and_stay_out_of_the_digest() -> None:
    m = scripted()
    digest, decisions = m.digest, m.decisions
    beat = NodeHeartbeat(node_id="n0", gpus=(
        GpuSample(uuid="GPU-a", utilization_ratio=0.75, memory_used_bytes=1 << 30),), jobs=("a",))
    m.handle(envelope(beat, event_id="hb", occurred_at=650.0, producer="nodeagent-n0",
                      causation_id=None), 650.0)
    assert (m.digest, m.decisions) == (digest, decisions)
    got = samples(exposition(registry_for(m, cluster(2, 4))))
    assert got[("loom_gpu_utilization_ratio", (("gpu", "GPU-a"), ("node", "n0")))] == 0.75
    assert got[("loom_gpu_memory_used_bytes", (("gpu", "GPU-a"), ("node", "n0")))] == 1 << 30
    assert got[("loom_node_last_heartbeat_seconds", (("node", "n0"),))] == 650.0
