"""The Grafana dashboard in deploy/ queries only metrics the metrics service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from schemas.events import GpuSample, NodeHeartbeat, envelope
from services.metrics.prometheus import exposition, registry_for
from tests.builders import cluster
from tests.services.metrics.test_prometheus import scripted

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "loom-dashboard.json"
PROMQL_FUNCTIONS = {"histogram_quantile", "sum", "by", "le", "clamp_min", "time", "rate"}


def exported_names() -> set[str]:
    core = scripted()
    beat = NodeHeartbeat(node_id="n0", gpus=(
        GpuSample(uuid="GPU-a", utilization_ratio=0.5, memory_used_bytes=1),))
    core.handle(envelope(beat, event_id="hb", occurred_at=1.0, producer="nodeagent-n0",
                         causation_id=None), 1.0)
    text = exposition(registry_for(core, cluster(2, 4)))
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_panel_queries_metrics_loom_exports() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    assert dash["panels"], "no panels"
    for panel in dash["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"[a-z_]+(?=[\s({\[)/*-]|$)", target["expr"]))
            used = {n for n in names if n.startswith("loom_")}
            assert used, target["expr"]
            assert used <= exported, (panel["title"], used - exported)
            assert names - used <= PROMQL_FUNCTIONS, names - used


def test_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
