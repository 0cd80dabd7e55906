"""`loom status --state/--tenant/--sort/--limit`: a busy cluster's view narrowed to what an
operator asks for; `--json` alone prints the scheduler's state unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom import live_cli
from loom.cli import main
from loom.status_view import select, until


def _row(job_id: str, state: str, tenant: str = "lab", gpus: int = 1, done: float = 0.0,
         eta: float | None = None, pos: int | None = None) -> dict[str, Any]:
    return {"job_id": job_id, "state": state, "reason": "r", "queue_position": pos,
            "gpus": gpus, "nodes": [], "iterations": 100, "done": done, "eta": eta,
            "tenant": tenant, "model": "resnet18"}


JOBS = [
    _row("a", "running", "lab", 4, 50.0, eta=90.0),
    _row("b", "queued", "nlp", 2, pos=2),
    _row("c", "finished", "lab", 1, 100.0),
    _row("d", "queued", "lab", 8, pos=1),
    _row("e", "preempted", "nlp", 1, 10.0, pos=3),
    _row("f", "running", "nlp", 2, 80.0, eta=40.0),
]
STATE: dict[str, Any] = {"now": 10.0, "policy": "srtf", "cycle": 7, "nodes": ["n0"],
                         "drained": [], "lost": [], "suspended": [], "jobs": JOBS}


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["job_id"] for r in rows]


@pytest.mark.parametrize(("states", "tenants", "sort", "limit", "shown", "matched"), [
    ((), (), "submit", None, ["a", "b", "c", "d", "e", "f"], 6),
    (("queued",), (), "submit", None, ["b", "d"], 2),
    (("queued", "preempted"), ("nlp",), "submit", None, ["b", "e"], 2),
    ((), ("lab",), "gpus", None, ["d", "a", "c"], 3),
    ((), (), "progress", 2, ["c", "f"], 6),
    (("queued", "preempted"), (), "queue", None, ["d", "b", "e"], 3),
    (("running",), (), "eta", None, ["f", "a"], 2),
    ((), (), "job", 3, ["a", "b", "c"], 6),
    ((), (), "state", None, ["b", "d", "a", "f", "e", "c"], 6),
    (("failed",), (), "submit", None, [], 0),
])
def test_select(states: tuple[str, ...], tenants: tuple[str, ...], sort: str,
                limit: int | None, shown: list[str], matched: int) -> None:
    rows, count = select(JOBS, states, tenants, sort, limit)
    assert _ids(rows) == shown and count == matched


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_status(url: str, auth: Any = None) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(STATE))  # fresh, as a reply would be
        return copy

    monkeypatch.setattr(live_cli, "_status", fake_status)


@pytest.mark.parametrize(("flags", "shown", "title"), [
    ([], ["a", "b", "c", "d", "e", "f"], "6 jobs"),
    (["--state", "waiting"], ["b", "d", "e"], "3 of 3 matching jobs (6 in all)"),
    (["--state", "queued", "--tenant", "lab"], ["d"], "1 of 1 matching jobs"),
    (["--tenant", "lab,nlp", "--sort", "gpus", "--limit", "2"], ["d", "a"],
     "2 of 6 matching jobs"),
])
def test_status_prints_only_the_jobs_asked_for(
        cluster: None, flags: list[str], shown: list[str], title: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", *flags]) == 0
    printed = capsys.readouterr().out
    lines = [line.split("│")[1].strip() for line in printed.splitlines()
             if line.startswith("│")]
    assert lines == shown and title in printed


def test_json_alone_is_the_state_unchanged(cluster: None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == STATE


def test_json_with_a_filter_keeps_the_shape(cluster: None,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--json", "--state", "running"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {**STATE, "jobs": [JOBS[0], JOBS[5]]}


@pytest.mark.parametrize("flags", [["--state", "sleeping"], ["--limit", "0"],
                                   ["--sort", "colour"]])
def test_bad_filters_are_refused_by_the_parser(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["status", *flags])
    assert exc.value.code == 2


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0 s"), (45.4, "45 s"), (60, "1m"), (754, "12m"), (3600 + 7 * 60, "1h07m"),
    (2 * 86400 + 4 * 3600 + 59, "2d04h"), (-5, "0 s"),
])
def test_until(seconds: float, shown: str) -> None:
    assert until(seconds) == shown


def test_waiting_jobs_show_when_they_should_start(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A scheduler with forecasts on: each waiting job's forecast start, as time from now;
    "?" for one the forecast does not reach; `--sort start` puts the soonest first."""
    jobs = [dict(j) for j in JOBS]
    starts = {"b": 10.0 + 754, "d": 10.0 + 2 * 3600, "e": None}
    for j in jobs:
        j["forecast_start_s"] = starts.get(j["job_id"])
    state = {**STATE, "jobs": jobs, "forecast": {"at": 10.0, "every_s": 60.0}}

    async def fake_status(url: str, auth: Any = None) -> dict[str, Any]:
        return state

    monkeypatch.setattr(live_cli, "_status", fake_status)
    assert main(["status", "--state", "waiting", "--sort", "start"]) == 0
    printed = capsys.readouterr().out
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in printed.splitlines()
             if line.startswith("│")]
    assert "starts in" in printed
    assert [(c[0], c[7]) for c in cells] == [("b", "12m"), ("d", "2h00m"), ("e", "?")]
