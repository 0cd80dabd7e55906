"""bench/gpu_validation.py on fake GPUs: the script that validates a real GPU node runs here
end to end (NATS, the control plane, a node agent, real CPU trainers), so that its one run
on a GPU machine does not fail on its own bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.nats

REPO = Path(__file__).resolve().parents[2]
STEPS = ("environment", "doctor", "gpu_backend", "cluster", "families", "preemption", "mps")


def test_the_validation_runs_every_step_on_fake_gpus(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": ""}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_validation.py"),
                           "--fake-gpus", "1", "--out", str(tmp_path), "--budget-s", "150"],
                          capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "== summary" in done.stdout
    report = json.loads((tmp_path / "gpu_validation.json").read_text())
    assert report["mode"] == "fake (1 GPUs)"
    assert {name: step["ok"] for name, step in report["steps"].items()} == dict.fromkeys(
        STEPS, True), report["steps"]
    assert report["findings"] == []
    assert report["summary"] and all({"what", "value"} == set(r) for r in report["summary"])

    doctor = report["doctor"]  # `loom doctor --json` on the same fake GPUs: all clear
    assert doctor["exit"] == 0 and doctor["worst"] == "pass"
    assert {c["check"] for c in doctor["checks"]} >= {"driver", "gpus", "ecc", "checkpoint"}

    gpu = report["gpu"]
    assert gpu["backend"] == "fake" and gpu["errors"] == {}
    assert [g["uuid"] for g in gpu["discover"]] == ["GPU-fake-n0-0"]
    busy = gpu["telemetry_busy"]
    assert busy["device"] == "cpu" and busy["samples"] and not busy["errors"]
    assert busy["exit_code"] == 0 and busy["last_record"] == "stopped"  # checkpointed on TERM

    assert report["cluster"]["services"] == ["metrics", "nodeagent-n0", "placer", "scheduler"]
    assert report["cluster"]["node_info"]["backend"] == "fake"
    iterations = report["plan"]["iterations"]
    families = report["families"]
    assert set(families) == {"cnn", "transformer", "lstm", "rl"}
    for family, job in families.items():
        assert job["state"] == "finished", (family, job)
        assert job["iterations_done"] == iterations > 0
        assert job["it_per_s"] > 0 and job["device"] == "cpu"
        assert job["launches"] == 1
    assert report["heartbeats"]["with_gpu_samples"] > 0

    pre = report["preemption"]
    assert pre["resumed"] and pre["resumed_at"] == pre["stopped_at"] > 0
    assert pre["checkpoint_reason"] == "preempt" and pre["checkpoint_bytes"] > 0
    assert pre["stop_latency_s"] > 0 and pre["restart_latency_s"] > 0
    assert pre["state"] == "finished" and pre["iterations_done"] == 2 * iterations
    assert pre["launches"] == 2

    mps = report["mps"]
    assert mps["set_policy"] == "set-policy muri-s: done"
    pair = {"gv-mps-cnn", "gv-mps-transformer"}
    assert any(set(x["colocated"]) == pair for x in mps["launches"])
    assert {j: e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for j, e in mps["trainer_env"].items()} \
        == dict.fromkeys(pair, "50")
    assert mps["overlap_s"] > 0
    for job_id, job in mps["jobs"].items():
        assert job["state"] == "finished"
        assert job["iterations_done"] == mps["iterations"][job_id] > 0
    assert report["teardown"]["agent_exit"] == 0
    assert report["teardown"]["control_plane_exits"] == [0, 0, 0]
