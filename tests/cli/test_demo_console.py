"""`loom demo` on the console: a failed trainer is one line naming the log file, where its
traceback is; other transitions print nothing of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain import causes
from loom.demo import failure_line
from schemas.causes import Cause
from schemas.events import JobTransition
from schemas.job import JobState

LOG = Path("runs/demo/loom-demo.log")
TRACEBACK = ("exit 1: Traceback (most recent call last):\n  File \"x.py\", line 1\n"
             "ModuleNotFoundError: No module named 'torch'")


def _transition(state: JobState, cause: Cause) -> JobTransition:
    return JobTransition(job_id="cnn-2gpu", state=state, previous=JobState.RUNNING,
                         cause=cause.text, reason=cause)


@pytest.mark.parametrize(("state", "cause", "line"), [
    (JobState.PREEMPTED, causes.retry("n0", TRACEBACK, 1, 2, 30.0),
     "cnn-2gpu: trainer failed on n0 (exit 1: Traceback (most recent call last): "
     f"(traceback in {LOG})"),
    (JobState.FAILED, causes.failed("exit 1: boom"),
     f"cnn-2gpu: failed: exit 1: boom (traceback in {LOG})"),
    (JobState.PREEMPTED, causes.retry("n0", "x" * 500, 1, 2, 30.0), "..."),
    (JobState.PREEMPTED, causes.PREEMPTED, None),
    (JobState.FINISHED, causes.COMPLETED, None),
    (JobState.QUEUED, causes.requeued("n1", "lost"), None),
])
def test_failure_line(state: JobState, cause: Cause, line: str | None) -> None:
    got = failure_line(_transition(state, cause), LOG)
    if line is None:
        assert got is None
    else:
        assert got is not None and line in got
        assert "\n" not in got and len(got) < 250
