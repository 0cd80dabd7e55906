"""`loom queues`' view of a status, without a cluster: the tables, the typed rows, `--cohort`,
and what it says when there are no queues."""

from __future__ import annotations

import pytest
from rich.console import Console

from loom.cli import build_parser
from loom.queues_cli import not_configured, only_cohorts, render, span
from schemas.queue_status import CohortState, QueueState, QueueStatus, QuotaUsage, WaitCount
from schemas.status import StatusCode


def text(status: QueueStatus) -> str:
    console = Console(width=200, record=True)
    console.print(render(status))
    return console.export_text()


STATUS = QueueStatus(
    at=3600.0, cycle=7, tenants_file=True,
    cohorts=(CohortState(name="gpu", half_life_s=86400.0, queues=("hetero", "plain")),),
    queues=(
        QueueState(name="hetero", cohort="gpu", rank=2, running_jobs=3, quotas=(
            QuotaUsage(gpu_type="a100", nominal=2, borrowing_limit=1, used=3, borrowed=1),
            QuotaUsage(gpu_type="v100", nominal=4, lending_limit=2, lent=1)),
            waiting=(WaitCount(code=StatusCode.BORROWING_LIMIT, jobs=2, job_id="h7",
                               reason="queue 'hetero' would hold 4 GPUs of a100, over ..."),)),
        QueueState(name="plain", cohort="gpu", rank=1,
                   quotas=(QuotaUsage(gpu_type="v100", nominal=2),)),
        QueueState(name="solo", quotas=(QuotaUsage(gpu_type="*", nominal=8, used=8),),
                   running_jobs=2, pending_jobs=1, pending_gpus=4)))


def test_a_table_per_cohort_a_row_per_gpu_type_and_the_reasons_below() -> None:
    out = text(STATUS)
    assert "cohort gpu · half-life 1d · 8 GPUs nominal · 3 used · 1 borrowed" in out
    assert "queues in no cohort · 8 GPUs nominal · 8 used" in out
    hetero = [line for line in out.splitlines() if "a100" in line or "v100" in line][:2]
    assert "hetero" in hetero[0] and "+1 / all" in hetero[0]
    assert "hetero" not in hetero[1] and "∞ / 2" in hetero[1]
    assert "borrowing_limit 2" in out
    assert "hetero: borrowing_limit (2 jobs; first h7): queue 'hetero' would hold 4" in out
    solo = next(line for line in out.splitlines() if "solo" in line)
    assert " any " in solo and "1 (4 GPUs)" in solo and " - " in solo


@pytest.mark.parametrize(("file", "says"), [
    (False, "the scheduler runs without a tenants file"),
    (True, "the scheduler's tenants file has no [queues.*]"),
])
def test_without_queues_it_says_why(file: bool, says: str) -> None:
    status = QueueStatus(at=0.0, cycle=0, tenants_file=file)
    assert not_configured(status).startswith("No queues are configured: " + says)
    assert text(status).startswith("No queues are configured")


def test_cohort_narrows_and_an_unknown_one_is_refused() -> None:
    assert [q.name for q in only_cohorts(STATUS, ["gpu"]).queues] == ["hetero", "plain"]
    assert only_cohorts(STATUS, []) is STATUS
    with pytest.raises(ValueError, match="--cohort 'cpu': no such cohort \\(cohorts: gpu\\)"):
        only_cohorts(STATUS, ["cpu"])


@pytest.mark.parametrize(("seconds", "shown"), [
    (604800.0, "7d"), (43200.0, "12h"), (5400.0, "90m"), (45.0, "45 s"), (3601.0, "1h00m")])
def test_half_lives_read_in_whole_units(seconds: float, shown: str) -> None:
    assert span(seconds) == shown


def test_the_command_takes_the_live_connection_flags() -> None:
    args = build_parser().parse_args(["queues", "--nats-url", "nats://h:1", "--json",
                                      "--cohort", "a", "--cohort", "b", "--nats-user", "u"])
    assert (args.nats_url, args.json, args.cohort, args.nats_user) == (
        "nats://h:1", True, ["a", "b"], "u")
