"""`--tenants` end to end: a two-tenant `loom sim` shows weighted shares; bad files exit 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from loom.cli import main
from loom.serve import ServeOptions, build_service
from schemas.tenants import TenantLimits, load_tenants
from services.scheduler.core import SchedulerCore
from traces import load_cluster

JOB_S = 100.0


def two_tenant_trace(path: Path, jobs_each: int = 40) -> Path:
    """A Philly-format trace (its `cluster` column is the tenant): tenants a and b each submit
    `jobs_each` one-GPU jobs of 100 s at once, interleaved, so arrival order favours neither."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "duration", "num_gpus", "gpu_time", "cluster"])
        for _ in range(jobs_each):
            for tenant in ("a", "b"):
                w.writerow(["2017-10-09 07:00:00", JOB_S, 1, JOB_S, tenant])
    return path


def gpu_s_until(jobs_csv: Path, window_s: float) -> dict[str, float]:
    """GPU-seconds each tenant held in [0, window_s] (no preemptions: one interval per job)."""
    held: dict[str, float] = {}
    for row in csv.DictReader(jobs_csv.open()):
        assert row["preemptions"] == "0"
        start, end = float(row["start_s"]), float(row["end_s"])
        overlap = max(0.0, min(end, window_s) - start)
        held[row["tenant"]] = held.get(row["tenant"], 0.0) + int(row["gpus"]) * overlap
    return held


@pytest.mark.parametrize("policy", ["fifo", "srtf"])
def test_weights_split_contended_gpus(tmp_path: Path, policy: str) -> None:
    trace = two_tenant_trace(tmp_path / "two.csv")
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[tenants.a]\nweight = 3\n\n[tenants.b]\nweight = 1\n")
    common = ["sim", "--trace", str(trace), "--cluster", "8", "--gpus-per-server", "8",
              "--policy", policy, "--overhead", "none"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--tenants", str(tenants), "--out", str(tmp_path / "shared")]) == 0

    # While both tenants have work queued (the first 500 s: b alone has 40 jobs of 100 s
    # waiting for its 2 GPUs), GPUs go 3:1 with the file and about
    # 1:1 without it.
    window = 5 * JOB_S
    plain = gpu_s_until(tmp_path / "plain" / "jobs.csv", window)
    shared = gpu_s_until(tmp_path / "shared" / "jobs.csv", window)
    assert plain["a"] / plain["b"] == pytest.approx(1.0, abs=0.15)  # the policy's order alone
    assert shared == {"a": 6 * window, "b": 2 * window}

    summary = json.loads((tmp_path / "shared" / "summary.json").read_text())
    per_tenant = summary["tenants"]
    assert per_tenant["a"]["finished"] == per_tenant["b"]["finished"] == 40
    assert per_tenant["a"]["gpu_s"] == per_tenant["b"]["gpu_s"] == 40 * JOB_S
    assert per_tenant["a"]["avg_jct_s"] < per_tenant["b"]["avg_jct_s"]  # weight buys speed


@pytest.mark.parametrize("command", [
    ["sim", "--trace", "tiresias/60_job", "--cluster", "n8g8", "--policy", "fifo"],
    ["compare", "--trace", "tiresias/60_job", "--cluster", "n8g8", "--policies", "fifo,srtf"],
    ["up", "--local-nodes", "1", "--trainers", "simulated"],
    ["serve", "scheduler", "--cluster", "n8g8"],
])
def test_bad_tenants_file_exits_2_naming_file_tenant_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    bad = tmp_path / "tenants.toml"
    bad.write_text("[tenants.nlp]\nweight = 2\nmax_gpus = -4\n")
    assert main([*command, "--tenants", str(bad)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"{bad}: tenant 'nlp': max_gpus: got -4; allowed: a number of at least 0" in err


def test_loom_serve_scheduler_gets_the_tenants_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": {"lab": {"weight": 2, "max_gpus": 4}}}))
    opts = ServeOptions("scheduler", "nats://127.0.0.1:1", load_cluster("n8g8"),
                        tenants=load_tenants(path))
    core = build_service(opts).core
    assert isinstance(core, SchedulerCore) and core.config.tenants is not None
    assert core.config.tenants.limits("lab") == TenantLimits(weight=2, max_gpus=4)
