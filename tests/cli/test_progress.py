"""Progress of long simulations (a bar on a terminal, a line every ~10 s elsewhere, nothing
with --quiet, an ETA that holds when a backlog drains) and the memory check before a run."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

import loom.progress as progress
import loom.runs as runs
from loom.cli import main
from loom.progress import (
    EventModel,
    MemoryRisk,
    RunProgress,
    check_memory,
    choose_mode,
    duration,
    estimate_bytes,
)

TRACE = "tiresias/60_job"
CLUSTER = "tiresias/cluster_spec"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("quiet", "stream", "mode"), [
    (True, Tty(), "off"), (False, Tty(), "bar"), (False, io.StringIO(), "lines"),
])
def test_the_mode_follows_the_terminal(quiet: bool, stream: io.StringIO, mode: str) -> None:
    assert choose_mode(quiet, stream) == mode


@pytest.mark.parametrize(("seconds", "text"), [(0, "0 s"), (59.4, "59 s"), (65, "1m05s"),
                                                (7260, "2h01m"), (math.inf, "?")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def _timeline(total: int, arrive_per_s: float, finish_per_s: float, per_arrival: float,
              per_finish: float, step: float = 0.5) -> list[tuple[float, int, int, int]]:
    """A run whose cost is its events at a steady rate: jobs arrive faster than they finish
    (a backlog) until all have arrived, then finish at the rate the freed events allow."""
    rows, t, arrived, finished = [], 0.0, 0.0, 0.0
    events_per_s = arrive_per_s * per_arrival + finish_per_s * per_finish
    while finished < total:
        t += step
        if arrived < total:
            arrived = min(total, arrived + arrive_per_s * step)
            finished = min(arrived, finished + finish_per_s * step)
        else:  # the whole event budget goes to finishing the backlog
            finished = min(total, finished + events_per_s / per_finish * step)
        events = per_arrival * arrived + per_finish * finished
        rows.append((t, int(arrived), int(finished), int(events)))
    return rows


# Events per arrival and per finish as measured on 100,000-job Gavel traces on 64 GPUs:
# FIFO about 3 and 6, SRTF about 7.6 and 6 (it re-plans on arrivals too).
@pytest.mark.parametrize(("arrive", "finish", "per_arrival", "per_finish"), [
    pytest.param(100.0, 100.0, 3.0, 6.0, id="no backlog"),
    pytest.param(600.0, 250.0, 3.0, 6.0, id="FIFO, a backlog drains after the last arrival"),
    pytest.param(400.0, 250.0, 7.6, 6.0, id="SRTF, a backlog"),
])
def test_the_eta_at_a_tenth_of_the_run_is_within_30_percent(
        arrive: float, finish: float, per_arrival: float, per_finish: float) -> None:
    total = 20_000
    rows = _timeline(total, arrive, finish, per_arrival, per_finish)
    end = rows[-1][0]
    clock = Clock()
    p = RunProgress("x", "off", clock=clock)
    for t, arrived, finished, events in rows:
        clock.t = t
        p(finished, total, t, events, arrived)
        if finished >= total // 10:
            predicted = t + p.eta(finished, total)
            assert abs(predicted - end) / end < 0.3, (predicted, end)
            return
    raise AssertionError("never reached 10 %")


def test_the_event_model_separates_arrivals_from_finishes() -> None:
    model = EventModel()
    for arrived, finished in [(100, 10), (200, 40), (300, 90), (400, 160)]:
        model.add(arrived, finished, 3 * arrived + 6 * finished)
    a, b = model.costs()
    assert a == pytest.approx(3) and b == pytest.approx(6)
    assert model.remaining(1000) == pytest.approx(3 * 600 + 6 * 840)


def test_lines_come_every_interval_with_the_numbers(tmp_path: Path) -> None:
    clock, out = Clock(), io.StringIO()
    p = RunProgress("srtf", "lines", interval_s=10.0, stream=out, clock=clock)
    with p:
        for second in range(1, 36):
            clock.t = float(second)
            p(second * 10, 1000, second * 100.0, second * 500, second * 20)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and p.lines == 3
    assert lines[0].startswith("srtf: 100/1,000 jobs (10%) · virtual t=1,000 s · 500 events/s")
    assert "ETA " in lines[0] and "10 s so far" in lines[0]


def test_off_writes_nothing() -> None:
    clock, out = Clock(), io.StringIO()
    with RunProgress("x", "off", interval_s=0.0, stream=out, clock=clock) as p:
        for second in range(30):
            clock.t = float(second)
            p(second, 100, 0.0, 10 * second, second)
    assert out.getvalue() == ""


@pytest.mark.parametrize(("flags", "lines"), [([], True), (["--quiet"], False)])
def test_sim_reports_progress_off_a_terminal_unless_quiet(
        flags: list[str], lines: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # a line at every report
    assert main(["sim", "--trace", TRACE, "--cluster", CLUSTER, "--policy", "srtf",
                 "--no-plot", "--out", str(tmp_path), *flags]) == 0
    err = capsys.readouterr().err
    assert ("srtf: " in err and "/60 jobs" in err and "events/s" in err) == lines


@pytest.mark.parametrize(("jobs", "nodes", "runs", "available", "refused"), [
    (1_000, 8, 1, 8e9, False),
    (1_000_000, 16, 1, 4e9, True),  # a million jobs: about 6 GB on the high side
    (1_000_000, 16, 1, 64e9, False),
    (100_000, 64, 4, 3e9, True),  # four at once
    (100_000, 64, 1, None, False),  # unknown memory: no check
])
def test_check_memory(jobs: int, nodes: int, runs: int, available: float | None,
                      refused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "available_bytes", lambda: None)
    if refused:
        with pytest.raises(MemoryRisk, match="--no-memory-check to run it anyway"):
            check_memory(jobs, nodes, runs, available)
    else:
        assert check_memory(jobs, nodes, runs, available) == runs * estimate_bytes(jobs,
                                                                                  nodes)


@pytest.mark.parametrize(("jobs", "nodes", "peak"), [
    (92_080, 128, 385e6),  # trace2 x16 given whole, srtf (docs/validation.md, issue 20)
    (15_802, 128, 140e6),  # itp/cluster04 through `loom sim`
    (5_755, 12_500, 145e6),  # trace2 on 100,000 GPUs
])
def test_the_estimate_covers_the_measured_peak(jobs: int, nodes: int, peak: float) -> None:
    assert peak <= estimate_bytes(jobs, nodes) <= 3 * peak


@pytest.mark.parametrize(("command", "flags", "rc"), [
    ("sim", [], 2), ("sim", ["--no-memory-check"], 0),
    ("compare", [], 2), ("compare", ["--no-memory-check"], 0),
])
def test_a_run_that_would_exhaust_memory_stops_before_it_starts(
        command: str, flags: list[str], rc: int, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "available_bytes", lambda: 1e6)  # 1 MB free
    policy = ["--policy", "srtf"] if command == "sim" else ["--policies", "srtf",
                                                           "--processes", "1"]
    assert main([command, "--trace", TRACE, "--cluster", CLUSTER, *policy, "--no-plot",
                 "--quiet", "--out", str(tmp_path), *flags]) == rc
    err = " ".join(capsys.readouterr().err.split())
    assert ("would likely exhaust it" in err) == (rc == 2)
    assert (tmp_path / ("summary.json" if command == "sim" else "compare.json")).exists() \
        == (rc == 0)


@pytest.mark.parametrize(("flags", "lines"), [([], True), (["--quiet"], False)])
def test_replay_reports_its_progress_in_messages(flags: list[str], lines: bool,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # a line at every report
    log = Path(__file__).resolve().parents[2] / "traces/logs/tiresias-60job.eventlog.gz"
    assert main(["replay", str(log), *flags]) == 0
    captured = capsys.readouterr()
    assert "OK " in captured.out
    assert ("replay: " in captured.err and " messages (" in captured.err) == lines


@pytest.mark.parametrize(("flags", "lines"), [([], True), (["--quiet"], False)])
def test_compare_off_a_terminal_reports_its_runs_in_lines(
        flags: list[str], lines: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runs, "LINE_INTERVAL_S", 0.0)  # a line at every look
    assert main(["compare", "--trace", TRACE, "--cluster", CLUSTER, "--policies", "fifo,srtf",
                 "--processes", "1", "--no-plot", "--out", str(tmp_path), *flags]) == 0
    err = capsys.readouterr().err
    assert ("runs: " in err and "/2 done" in err) == lines
