"""Node health in Prometheus: each node's latest heartbeat report, by the scheduler's rule
(`domain.health`): cordoned nodes, GPUs out of service, and every problem by check."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from schemas.events import HealthProblem, NodeHealth, NodeHeartbeat, envelope
from services.metrics.core import MetricsCore
from services.metrics.prometheus import exposition, registry_for
from tests.builders import cluster


def samples(m: MetricsCore) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    text = exposition(registry_for(m, cluster(3, 4)))
    return {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in text_string_to_metric_families(text) if "health" in f.name
            or f.name == "loom_gpu_out_of_service"}


def beat(m: MetricsCore, node: str, t: float, health: NodeHealth | None) -> None:
    m.handle(envelope(NodeHeartbeat(node_id=node, health=health), event_id=f"{node}{t}",
                      occurred_at=t, producer=f"nodeagent-{node}", causation_id=None), t)


def test_cordoned_nodes_gpus_out_and_problems_are_exported_and_cleared() -> None:
    m = MetricsCore(12)
    beat(m, "n0", 1.0, NodeHealth(problems=(
        HealthProblem(check="ecc", status="fail", gpu=2, detail="GPU 2: 1 uncorrectable"),
        HealthProblem(check="dcgm", status="warn", detail="absent"))))
    beat(m, "n1", 1.0, NodeHealth(problems=(
        HealthProblem(check="checkpoint", status="fail", detail="not writable"),)))
    beat(m, "n2", 1.0, None)  # no checks run there: nothing said about it
    got = samples(m)
    assert got["loom_node_health_cordoned"] == {(("node", "n0"),): 0.0, (("node", "n1"),): 1.0}
    assert got["loom_gpu_out_of_service"] == {(("gpu", "2"), ("node", "n0")): 1.0}
    assert got["loom_node_health_problem"] == {
        (("check", "ecc"), ("gpu", "2"), ("node", "n0"), ("status", "fail")): 1.0,
        (("check", "dcgm"), ("gpu", ""), ("node", "n0"), ("status", "warn")): 1.0,
        (("check", "checkpoint"), ("gpu", ""), ("node", "n1"), ("status", "fail")): 1.0}
    beat(m, "n1", 2.0, NodeHealth())
    beat(m, "n0", 2.0, NodeHealth())
    got = samples(m)
    assert set(got["loom_node_health_cordoned"].values()) == {0.0}
    assert got.get("loom_gpu_out_of_service", {}) == {}
    assert got.get("loom_node_health_problem", {}) == {}
