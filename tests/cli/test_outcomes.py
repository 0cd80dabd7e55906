"""`loom sim` and `loom compare` show every outcome: finished, rejected (with the reasons
counted), unfinished; `--strict` fails a run that rejected or left any job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loom.cli import main
from loom.report import incomplete, outcome_line, results_table, solver_line

TRACE = "tiresias/60_job"
FITS = "tiresias/cluster_spec"  # every job of the trace fits
SMALL = "4"  # one server of 4 GPUs: the trace's 10 larger jobs are rejected


def _summary(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"policy": "srtf", "jobs": 60, "finished": 60, "rejected": 0,
                               "rejected_by": {}, "unfinished": 0}
    return {**base, **fields}


@pytest.mark.parametrize(("summary", "line", "bad"), [
    (_summary(), "60 jobs: 60 finished, 0 rejected, 0 unfinished", False),
    (_summary(finished=30, rejected=30, rejected_by={"rejected_too_large": 30}),
     "60 jobs: 30 finished, 30 rejected (30 too large for the cluster), 0 unfinished", True),
    (_summary(finished=50, rejected=6, unfinished=4,
              rejected_by={"rejected_by_quota": 2, "rejected_too_large": 4}),
     "60 jobs: 50 finished, 6 rejected (4 too large for the cluster, 2 over a tenant quota), "
     "4 unfinished", True),
    (_summary(finished=58, unfinished=2), "60 jobs: 58 finished, 0 rejected, 2 unfinished",
     True),
    (_summary(finished=57), "60 jobs: 57 finished, 0 rejected, 0 unfinished, 3 failed", False),
    (_summary(finished=57, failures_replayed=12),
     "60 jobs: 57 finished, 0 rejected, 0 unfinished, 3 failed; 12 recorded failures replayed",
     False),
    (_summary(finished=59, rejected=1, rejected_by={"rejected_by_policy": 1}),
     "60 jobs: 59 finished, 1 rejected (1 refused by the policy), 0 unfinished", True),
])
def test_outcome_line(summary: dict[str, object], line: str, bad: bool) -> None:
    assert outcome_line(summary) == line
    assert incomplete(summary) is bad


def _solved(**fields: object) -> dict[str, object]:
    stats: dict[str, object] = {"solves": 41, "compiles": 7, "fallbacks": 0, "inaccurate": 0,
                                "secondary": 0, "total_s": 0.8123}
    return _summary(solver={**stats, **fields})


@pytest.mark.parametrize(("summary", "line"), [
    (_summary(), None),  # a policy that solves nothing says nothing
    (_solved(), "solver: 41 solves in 0.81 s (7 compiled)"),
    (_solved(compiles=0, inaccurate=2, fallbacks=1),
     "solver: 41 solves in 0.81 s; 2 kept an inaccurate answer; 1 fell back from the solver"),
    (_solved(secondary=3), "solver: 41 solves in 0.81 s (7 compiled); 3 answered by a later "
                           "solver"),
    # Chronus' MILP counts its own outcomes
    (_summary(solver={"terms": 9, "solves": 4, "timeouts": 1, "failures": 2, "unlaid": 1,
                      "total_s": 61.5}),
     "solver: 4 solves in 61.50 s; 1 stopped at the time limit; 2 failed; 1 left to the greedy "
     "layout"),
])
def test_solver_line(summary: dict[str, object], line: str | None) -> None:
    assert solver_line(summary) == line


@pytest.mark.parametrize(("summaries", "shown"), [
    ([_summary()], set()),
    ([_summary(), _summary(rejected=3)], {"rejected"}),
    ([_summary(unfinished=1, rejected=2)], {"rejected", "unfinished"}),
])
def test_the_table_has_rejected_and_unfinished_columns_when_any_are(
        summaries: list[dict[str, object]], shown: set[str]) -> None:
    headers = {str(c.header) for c in results_table(summaries, "t").columns}
    assert headers & {"rejected", "unfinished"} == shown


@pytest.mark.parametrize(("cluster", "strict", "rc", "says"), [
    (FITS, False, 0, "60 jobs: 60 finished, 0 rejected, 0 unfinished"),
    (FITS, True, 0, "60 jobs: 60 finished, 0 rejected, 0 unfinished"),
    (SMALL, False, 0, "10 rejected (10 too large for the cluster)"),
    (SMALL, True, 1, "10 rejected (10 too large for the cluster)"),
])
def test_sim_prints_outcomes_and_strict_fails_on_rejections(
        cluster: str, strict: bool, rc: int, says: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--trace", TRACE, "--cluster", cluster, "--policy", "srtf", "--no-plot",
            "--out", str(tmp_path)] + (["--strict"] if strict else [])
    assert main(argv) == rc
    printed = " ".join(capsys.readouterr().out.split())
    assert says in printed
    assert ("jobs were rejected" in printed) == (cluster == SMALL)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rejected_by"] == ({"rejected_too_large": 10} if cluster == SMALL else {})


def test_compare_prints_each_policys_outcomes(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--trace", TRACE, "--cluster", SMALL, "--policies", "fifo,srtf",
                 "--no-plot", "--processes", "1", "--out", str(tmp_path), "--strict"]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    for policy in ("fifo", "srtf"):
        assert f"{policy}: 60 jobs: 50 finished, 10 rejected" in printed


def test_queueing_is_reported_as_time_to_first_start_and_time_pending(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--trace", TRACE, "--cluster", FITS, "--policy", "srtf", "--no-plot",
                 "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "to start" in printed and "pending" in printed and "avg queue" not in printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["avg_first_start_s"] == summary["avg_queueing_s"]  # the old name stays
    assert summary["avg_pending_s"] >= summary["avg_first_start_s"]
    header = (tmp_path / "jobs.csv").read_text().splitlines()[0].split(",")
    assert "queueing_s" in header and "pending_s" in header
