"""bench/scale.py runs each size in its own process and prints one row per run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_small_overlay_prints_its_row_with_the_runs_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--policies", "fifo,srtf",
         "--jobs", "120", "--gpus", "16,64"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True)
    rows = [line.split() for line in done.stdout.splitlines()
            if line.split() and line.split()[0] in ("fifo", "srtf")]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("fifo", "120", "16"), ("fifo", "120", "64"), ("srtf", "120", "16"), ("srtf", "120", "64")]
    for r in rows:
        events, per_event, per_s = int(r[5]), float(r[6]), float(r[7])
        assert events > 120 and per_event > 0
        assert abs(per_event * per_s / 1e6 - 1) < 0.05  # µs per event and events/s agree
        assert r[10] == "120"  # every job finished


def srtf_row(*extra: str) -> list[str]:
    """The row of srtf on 300 jobs of trace2 over 32 GPUs, run with `extra` flags."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--policies", "srtf",
         "--jobs", "300", "--gpus", "32", *extra],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True)
    (row,) = [line.split() for line in done.stdout.splitlines() if line.startswith("srtf")]
    assert row[10] == "300"  # every job finished
    return row


def test_a_streamed_overlay_decides_as_the_listed_one() -> None:
    assert srtf_row("--stream")[11] == srtf_row()[11]


def test_the_policys_own_time_is_a_last_column_within_the_runs_and_decides_nothing() -> None:
    plain, timed = srtf_row(), srtf_row("--policy-time")
    assert len(plain) == 12 and len(timed) == 13
    assert timed[11] == plain[11]  # timing the policy changes no decision
    per_event, policy_per_event = float(timed[6]), float(timed[12])
    assert 0 < policy_per_event < per_event


def test_an_unknown_policy_timed_is_still_named_with_the_registered_ones() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--policies", "nosuch",
         "--jobs", "50", "--gpus", "16", "--policy-time"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True)
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("nosuch")]
    assert "unknown policy 'nosuch'" in row and "srtf" in row
