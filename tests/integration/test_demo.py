"""`loom demo` end to end: 2 node agents × 2 fake GPUs, six real PyTorch jobs under SRTF.

Everything is real here except the GPUs: an embedded nats-server, every service in its own
process, trainer processes (CPU, gloo for the 2-GPU jobs) launched by the node agents,
preempted with SIGTERM, checkpointing, and resuming where they stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.nats


def test_demo_runs_six_real_jobs_with_a_preemption_and_a_resume(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "loom.cli", "demo", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    jobs = summary["jobs"]
    assert len(jobs) == 6 and summary["all_finished"]
    for job in jobs:  # exactly the iterations asked for, by the trainer's own count
        assert job["state"] == "finished"
        assert job["trainer_iterations"] == job["iterations"], job
    assert {j["gpus"] for j in jobs} == {1, 2}
    resumed = [j for j in jobs if j["stops"]]
    assert resumed, "no job was preempted"
    for job in resumed:
        stop = job["stops"][0]
        assert stop["iteration"] > 0
        assert job["resumed_at"] and job["resumed_at"][0] == stop["iteration"]  # checkpoint
        # The loss goes on from where it was; a restart from scratch would jump back up.
        before, after = stop["loss"], job["first_loss_after_resume"]
        assert after is not None and after <= 1.5 * before + 0.05, job
    assert summary["finished"] == 6 and summary["avg_jct_s"] > 0
    assert summary["prometheus_finished"] == 6
    assert summary["prometheus_jct_count"] == 6
    assert summary["prometheus_gpus_reporting"] == 4  # every fake GPU, from heartbeats
