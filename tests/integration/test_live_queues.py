"""Queues on a live cluster: `loom up --tenants FILE` with two queues of one cohort, 2 GPUs
nominal each, on one node of four fake GPUs running real PyTorch trainers (CPU).

Queue a's two 2-GPU jobs take all four GPUs (a borrows b's idle quota) and a third waits.
Then queue b submits a 2-GPU job within its nominal quota: one of a's running jobs is
reclaimed (status `reclaimed_by_queue`, the reason naming queue b), checkpoints within its
stop grace, and b's job starts in the same cycle (event-driven re-planning: no round to wait
for). While a's jobs wait, `loom status` shows why and when they should start (the reclaimed
job at once, though the forecast before the reclaim is recent). Once b's job ends, the
reclaimed job resumes from its checkpoint, not from iteration 0.

b's job is a plain command that holds its GPUs until the test lets it end (a file), so the
waiting states last as long as the test looks at them, however loaded the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.serve import control_subject
from schemas import subjects
from schemas.codec import decode
from schemas.events import JobTransition, PlanDecided, TrainerReport
from schemas.job import JobState
from tests.integration.live_up import GATED_SCRIPT, LOOM, loom_up

pytest.importorskip("torch")
pytestmark = pytest.mark.nats

GRACE_S = 30.0  # the node agent's stop grace, as `loom up` starts it (`serve --grace-s`)
# Not `loom up`'s default (60), so the scheduler must have been given it; and longer than the
# test, so a job that begins waiting after the latest forecast gets one because it waits
# (`forecasting.covers`), not because the latest has grown old.
FORECAST_EVERY_S = 600.0
CHECKPOINTED = 20  # iterations a's jobs train before b's job arrives: progress to keep
LONG = 1_000_000  # iterations of a's jobs: they never finish within the test

TENANTS = """\
[cohorts.lab]

[queues.a]
cohort = "lab"
tenants = ["team-a"]
nominal = 2

[queues.b]
cohort = "lab"
tenants = ["team-b"]
nominal = 2
"""



@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`loom up` as an operator types it, with the tenants file; yields it and its URL."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    with loom_up(tmp_path, "--local-nodes", "1", "--gpus-per-node", "4", "--tenants",
                 str(tenants), "--forecast-every", str(FORECAST_EVERY_S),
                 "--prometheus-port", "0") as up:
        yield up


@dataclass
class Watch:
    """What the cluster says as it happens: trainers' reports, transitions, plans."""

    reports: dict[str, list[tuple[float, TrainerReport]]] = field(default_factory=dict)
    transitions: list[tuple[float, JobTransition]] = field(default_factory=list)
    plans: list[PlanDecided] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_message(self, msg: Any) -> None:
        body, now = decode(msg.data).body, time.monotonic()
        if isinstance(body, TrainerReport):
            self.reports.setdefault(body.job_id, []).append((now, body))
        elif isinstance(body, JobTransition):
            self.transitions.append((now, body))
        elif isinstance(body, PlanDecided):
            self.plans.append(body)
        self.changed.set()

    async def until(self, what: str, found: Callable[[], Any], wait_s: float = 90.0) -> Any:
        """The first truthy `found()`, re-checked as messages arrive (and every second, for
        what is polled); a timeout names the step and what the trainers said so far."""
        deadline = time.monotonic() + wait_s
        while not (got := found()):
            left = deadline - time.monotonic()
            if left <= 0:
                trail = {j: [(r.event, r.iteration) for _, r in rs][-6:]
                         for j, rs in self.reports.items()}
                states = [(t.job_id, t.state.value, t.cause) for _, t in self.transitions]
                raise AssertionError(f"no {what} within {wait_s:g} s; reports {trail}; "
                                     f"transitions {states}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(1.0, left))
        return got

    def report(self, job: str, pred: Callable[[TrainerReport], bool], after: float = 0.0
               ) -> tuple[float, TrainerReport] | None:
        return next(((t, r) for t, r in self.reports.get(job, ()) if t >= after and pred(r)),
                    None)

    def transition(self, pred: Callable[[JobTransition], bool]
                   ) -> tuple[float, JobTransition] | None:
        return next(((t, x) for t, x in self.transitions if pred(x)), None)


async def loom(*args: str) -> str:
    """A `loom` command as a person runs it; its output."""
    proc = await asyncio.create_subprocess_exec(*LOOM, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


Row = dict[str, Any]


async def rows(nc: Any) -> dict[str, Row]:
    """The scheduler's job rows, as `loom status --json` prints them."""
    state = json.loads((await nc.request(control_subject("scheduler"), b"", timeout=10)).data)
    return {j["job_id"]: j for j in state["jobs"]}


async def row_until(nc: Any, job: str, what: str, pred: Callable[[Row], bool]) -> Row:
    """`job`'s row, asked for until `pred` accepts it (a job just submitted may not be in
    the scheduler's table yet)."""
    deadline = time.monotonic() + 90
    while True:
        got = (await rows(nc)).get(job)
        if got is not None and pred(got):
            return got
        assert time.monotonic() < deadline, f"{job}: not {what} within 90 s: {got}"
        await asyncio.sleep(0.2)


def progressed(job: str, watch: Watch, least: int) -> Callable[[], Any]:
    return lambda: watch.report(job, lambda r: r.event == "progress" and r.iteration >= least)


async def scenario(url: str, gate: Path) -> dict[str, Any]:
    nc = await nats.connect(url)
    watch = Watch()
    for subject in (subjects.JOB_PROGRESS, subjects.JOB_TRANSITION, subjects.PLAN_DECIDED):
        await nc.subscribe(subject, cb=watch.on_message)
    url_args = ("--nats-url", url)
    t0 = time.monotonic()
    times: dict[str, float] = {}
    steps: list[str] = []  # when each step was done, printed with the test's output

    def step(what: str) -> None:
        steps.append(f"{time.monotonic() - t0:6.1f} s  {what}")

    async def submit(job: str, tenant: str, *extra: str) -> None:
        assert (await loom("submit", *url_args, "--job-id", job, "--tenant", tenant,
                           *extra)).strip() == job

    # Queue a takes all four GPUs: its nominal two and b's idle two.
    for job in ("a1", "a2"):
        await submit(job, "team-a", "--model", "resnet18", "--gpus", "2", "--iterations",
                     str(LONG), "--iteration-time", "0.01")
    for job in ("a1", "a2"):
        await watch.until(f"{job} at iteration {CHECKPOINTED}",
                          progressed(job, watch, CHECKPOINTED))
    step(f"a1, a2 at iteration {CHECKPOINTED}")
    await submit("a3", "team-a", "--model", "resnet18", "--gpus", "2", "--iterations", "100",
                 "--iteration-time", "0.01")
    queued = await row_until(nc, "a3", "held by the queues, with a forecast", lambda r: (
        r["state"] == "queued" and r["code"] == "waiting_for_quota_in_cohort"
        and r["forecast_start_s"] is not None))
    step("a3 held, with a forecast")

    # b's job within its nominal quota: a gives back what it borrowed.
    submitted = time.monotonic()
    await submit("b1", "team-b", "--model", "script", "--gpus", "2", "--iterations", "20",
                 "--iteration-time", "0.5", "--env", f"GATE={gate}",
                 "--command", sys.executable, "-c", GATED_SCRIPT)
    reclaimed_at, reclaim = await watch.until("a reclaim", lambda: watch.transition(
        lambda t: t.state is JobState.PREEMPTED))
    times["b1 submitted -> reclaim"] = reclaimed_at - submitted
    victim = reclaim.job_id
    step(f"{victim} reclaimed")
    # Shown at once with a forecast, though the last one is younger than FORECAST_EVERY_S.
    waiting = await row_until(nc, victim, "shown waiting, with a forecast", lambda r: (
        r["state"] == "preempted" and r["forecast_start_s"] is not None))
    times["reclaim -> shown with a forecast"] = time.monotonic() - reclaimed_at
    step(f"{victim} shown waiting, with a forecast")
    table = await loom("status", *url_args)
    state = json.loads(await loom("status", *url_args, "--json"))
    step("loom status, loom status --json")
    started_b, _ = await watch.until("b1's first progress", lambda: watch.report(
        "b1", lambda r: r.iteration >= 1))
    times["reclaim -> b1 runs"] = started_b - reclaimed_at
    step("b1 runs")
    stopped_at, stopped = await watch.until(f"{victim} stopped", lambda: watch.report(
        victim, lambda r: r.event == "stopped"))
    times["reclaim -> victim checkpointed"] = stopped_at - reclaimed_at
    # Its row shows the checkpointed progress once its node has reported the stop.
    await row_until(nc, victim, "at its checkpoint", lambda r: r["done"] == stopped.iteration)
    step(f"{victim} stopped at iteration {stopped.iteration}, shown")

    # b's job ends: the reclaimed job resumes from its checkpoint.
    released = time.monotonic()
    gate.touch()
    resumed_at, resumed = await watch.until(f"{victim} resumed", lambda: watch.report(
        victim, lambda r: r.event == "started", after=released))
    times["b1 released -> victim resumed"] = resumed_at - released
    step(f"{victim} resumed at iteration {resumed.iteration}")
    _, onward = await watch.until(f"{victim} trains on", lambda: watch.report(
        victim, lambda r: r.event == "progress" and r.iteration > resumed.iteration,
        after=resumed_at))
    after = await rows(nc)
    step(f"{victim} at iteration {onward.iteration}")
    await nc.close()
    print("\n".join(steps), {k: round(v, 1) for k, v in times.items()}, table, sep="\n")
    return {"victim": victim, "reclaim": reclaim, "queued": queued, "waiting": waiting,
            "table": table, "state": state, "stopped": stopped, "resumed": resumed,
            "onward": onward, "after": after, "watch": watch, "times": times}


def test_a_lender_reclaims_and_the_borrower_resumes_from_its_checkpoint(
        cluster: tuple[subprocess.Popen[str], str], tmp_path: Path) -> None:
    proc, url = cluster
    out = asyncio.run(scenario(url, tmp_path / "gate"))
    victim, reclaim, watch = out["victim"], out["reclaim"], out["watch"]
    other = "a2" if victim == "a1" else "a1"
    assert victim in ("a1", "a2")

    # a3 waited behind the borrowed GPUs: the queues said why, the forecast when.
    a3 = out["queued"]
    assert "queue 'a'" in a3["reason"] and "cohort 'lab'" in a3["reason"], a3

    # (a) One borrower reclaimed for b, with the cause, code and reason that name queue b.
    preempted = [t for _, t in watch.transitions if t.state is JobState.PREEMPTED]
    assert [t.job_id for t in preempted] == [victim], preempted
    assert reclaim.cause == "preempted: reclaimed by queue 'b'"
    assert reclaim.reason.kind == "preempted"
    row = out["waiting"]
    assert row["code"] == "reclaimed_by_queue", row
    assert row["reason"] == ("reclaimed by queue 'b': its jobs wait within its nominal quota, "
                             "which queue 'a' had borrowed")

    # (b) b's job started in the reclaim's own cycle, and ran well within the stop grace.
    [plan] = [p for p in watch.plans if any(s.job_id == victim for s in p.stops)]
    assert [launch.job_id for launch in plan.launches] == ["b1"]
    times = out["times"]
    assert times["reclaim -> victim checkpointed"] < GRACE_S  # stopped, not killed
    assert times["b1 submitted -> reclaim"] + times["reclaim -> b1 runs"] < GRACE_S

    # (d) While a's jobs waited, `loom status` showed when they should start and why.
    state = out["state"]
    assert state["forecast"]["every_s"] == FORECAST_EVERY_S  # `up` passed it on
    shown = {j["job_id"]: j for j in state["jobs"]}
    assert shown[victim]["state"] == "preempted" and shown["a3"]["state"] == "queued"
    for job in (victim, "a3"):
        assert shown[job]["forecast_start_s"] is not None, shown[job]
        # A start no earlier than the forecast it comes from (which may be older than now).
        assert shown[job]["forecast_start_s"] >= state["forecast"]["at"], (shown[job], state)
    assert shown[victim]["code"] == "reclaimed_by_queue"
    assert shown["a3"]["code"] == "waiting_for_quota_in_cohort"
    table = out["table"]
    for job in (victim, "a3"):
        line = next(ln for ln in table.splitlines() if f" {job} " in ln)
        # "starts in" shows a time (45 s, 12m, ...), not "?" nor nothing.
        assert re.search(r"│ +\d+(?: s|m|h\d\dm|d\d\dh) │", line), (job, table)
    assert "reclaimed by queue 'b'" in table

    # (c) The borrower resumed from its checkpoint, and trains on from there.
    stopped, resumed = out["stopped"], out["resumed"]
    assert stopped.iteration >= CHECKPOINTED
    assert resumed.resumed and resumed.iteration == stopped.iteration
    assert out["onward"].iteration > stopped.iteration
    after = out["after"]
    assert after[victim]["state"] == "running" and after[victim]["done"] >= stopped.iteration
    assert after["b1"]["state"] == "finished" and after[other]["state"] == "running"
    assert after["a3"]["state"] == "queued"  # a is at its quota plus what it may borrow

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # every service drained cleanly
