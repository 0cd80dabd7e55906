"""Library versions in event logs and summaries, and what a divergent replay says of them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgpack
import pytest

from loom.cli import main
from loom.eventlog import EventLogError, read_log, write_log
from loom.versions import DECISION_LIBRARIES, running_versions, version_changes, versions_note
from tests.replay.forging import forge_first_transition

LOGS = Path(__file__).resolve().parents[2] / "traces" / "logs"
HEADER = {"format": "loom-eventlog", "version": 1, "source": "sim",
          "run": {"policy": "fifo", "cluster": None}}
TRAILER = {"end": 0, "decision_digest": None}


def _sim(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    log = tmp_path / "run.eventlog.gz"
    assert main(["sim", "--trace", "tiresias/60_job", "--cluster", "muri/testbed/n1g8",
                 "--policy", "srsf", "--out", str(tmp_path / "out"), "--log", str(log)]) == 0
    return log, json.loads((tmp_path / "out" / "summary.json").read_text())


def test_running_versions_name_python_loom_and_the_decision_libraries() -> None:
    versions = running_versions()
    assert list(versions) == ["python", "loom", *DECISION_LIBRARIES]
    assert {"numpy", "scipy", "cvxpy", "highspy", "clarabel", "numba"} <= set(versions)
    assert all(isinstance(v, str) and v for v in versions.values())


def test_a_log_and_summary_written_now_carry_the_versions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, summary = _sim(tmp_path)
    assert read_log(log).versions == running_versions()
    assert summary["versions"] == running_versions()


def test_an_old_header_without_versions_reads_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "old.eventlog"
    path.write_bytes(msgpack.packb(HEADER) + msgpack.packb(TRAILER))
    assert read_log(path).versions is None
    for bundled in LOGS.glob("*.eventlog.gz"):  # version 1: recorded before logs had versions
        log = read_log(bundled)
        assert (log.versions is None) == (log.version == 1)


def test_a_malformed_versions_field_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.eventlog"
    path.write_bytes(msgpack.packb({**HEADER, "versions": {"numpy": 2}})
                     + msgpack.packb(TRAILER))
    with pytest.raises(EventLogError, match="record 0: header: 'versions' must map"):
        read_log(path)


@pytest.mark.parametrize("versions", [None, {"python": "3.9.0", "highspy": "1.0.0"}])
def test_rewriting_a_log_keeps_its_recorded_versions(
        tmp_path: Path, versions: dict[str, str] | None) -> None:
    old = read_log(LOGS / "tiresias-60job.eventlog.gz")
    write_log(dataclasses.replace(old, versions=versions), tmp_path / "again.eventlog.gz")
    assert read_log(tmp_path / "again.eventlog.gz").versions == versions


def test_version_changes_ignore_what_the_recording_does_not_say() -> None:
    running = {"python": "3.11.7", "numpy": "2.4.6", "highspy": "1.16.0"}
    assert version_changes(None, running) == []
    assert version_changes({"highspy": "1.11.0"}, running) == [("highspy", "1.11.0", "1.16.0")]
    assert version_changes(running, running) == []


def test_a_divergence_names_the_versions_that_differ(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _sim(tmp_path)
    log = read_log(path)
    running = running_versions()
    older = {**running, "highspy": "1.11.0", "clarabel": "0.9.0"}
    forged = forge_first_transition(log)[0]
    write_log(dataclasses.replace(forged, versions=older), tmp_path / "old.eventlog.gz")
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "old.eventlog.gz")]) == 1
    text = capsys.readouterr().out
    assert "DIVERGED: scheduler decision 1" in text
    assert f"recorded with highspy 1.11.0, running {running['highspy']}" in text
    assert f"recorded with clarabel 0.9.0, running {running['clarabel']}" in text
    assert "recorded with numpy" not in text  # only what differs
    assert "likely cause" in text


def test_a_divergence_with_the_same_or_unknown_versions_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _sim(tmp_path)
    forged = forge_first_transition(read_log(path))[0]
    write_log(forged, tmp_path / "same.eventlog.gz")
    write_log(dataclasses.replace(forged, versions=None), tmp_path / "unknown.eventlog.gz")
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "same.eventlog.gz")]) == 1
    assert "versions: as recorded" in capsys.readouterr().out
    assert main(["replay", str(tmp_path / "unknown.eventlog.gz")]) == 1
    assert "the log does not say which made its decisions" in capsys.readouterr().out


def test_versions_note_names_a_solver_upgrade_only_for_decision_libraries() -> None:
    running = {"python": "3.11.7", "loom": "0.2.0", "highspy": "1.16.0"}
    assert versions_note({**running, "loom": "0.1.0"}, running) == [
        "versions: recorded with loom 0.1.0, running 0.2.0"]
    note = versions_note({**running, "highspy": "1.11.0"}, running)
    assert note[0] == "versions: recorded with highspy 1.11.0, running 1.16.0"
    assert "likely cause" in note[1]
