"""The Grafana dashboard in deploy/ queries only metrics the metrics service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from schemas.events import GpuSample, NodeHeartbeat, envelope
from schemas.queue_status import QueueState, QueueStatus, QuotaUsage, WaitCount
from schemas.status import StatusCode
from services.metrics.prometheus import exposition, registry_for
from tests.builders import cluster
from tests.services.metrics.test_prometheus import scripted

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "loom-dashboard.json"
PROMQL_FUNCTIONS = {"histogram_quantile", "sum", "by", "le", "clamp_min", "time", "rate",
                    "increase"}
LABELS = {"queue", "code"}  # what panels group by


def exported_names() -> set[str]:
    core = scripted()
    beat = NodeHeartbeat(node_id="n0", gpus=(
        GpuSample(uuid="GPU-a", utilization_ratio=0.5, memory_used_bytes=1),))
    core.handle(envelope(beat, event_id="hb", occurred_at=1.0, producer="nodeagent-n0",
                         causation_id=None), 1.0)
    queue = QueueState(name="q", cohort="c", rank=1, quotas=(
        QuotaUsage(gpu_type="*", nominal=4, borrowing_limit=2, used=5, borrowed=1),),
        waiting=(WaitCount(code=StatusCode.BORROWING_LIMIT, jobs=1, job_id="j", reason="r"),))
    status = QueueStatus(at=1.0, cycle=1, tenants_file=True, queues=(queue,))
    core.handle(envelope(status, event_id="qs", occurred_at=1.0, producer="scheduler",
                         causation_id=None), 1.0)
    text = exposition(registry_for(core, cluster(2, 4)))
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_panel_queries_metrics_loom_exports() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    assert dash["panels"], "no panels"
    for panel in dash["panels"]:
        if panel["type"] == "row":  # a heading: no queries
            assert "targets" not in panel, panel["title"]
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"[a-z_]+(?=[\s({\[)/*-]|$)", target["expr"]))
            used = {n for n in names if n.startswith("loom_")}
            assert used, target["expr"]
            assert used <= exported, (panel["title"], used - exported)
            assert names - used <= PROMQL_FUNCTIONS | LABELS, names - used


def test_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])


def test_a_queues_row_charts_use_against_quota_borrowing_lending_and_waiting() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    row = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Queues")
    below = panels[row + 1:]
    assert all(p["gridPos"]["y"] > panels[row]["gridPos"]["y"] for p in below)
    queried = " ".join(t["expr"] for p in below for t in p["targets"])
    for name in ("loom_queue_used_gpus", "loom_queue_nominal_gpus", "loom_queue_borrowed_gpus",
                 "loom_queue_lent_gpus", "loom_queue_pending_jobs",
                 "loom_queue_reclaims_total"):
        assert name in queried, name
    stacked = next(p for p in below if "stacked" in p["title"])
    assert stacked["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
