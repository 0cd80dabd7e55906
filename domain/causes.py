"""The causes the scheduler writes on its transitions, as typed values (`schemas.causes`),
each with the text people read (unchanged from version 1 of the event, so decision digests
and logs read the same)."""

from __future__ import annotations

from schemas.causes import LAUNCH_TIMED_OUT, RECORDED_FAILURE, Cause, failure_fault

ADMITTED = Cause(kind="admitted", text="admitted")
STARTED = Cause(kind="started", text="started")
RESUMED = Cause(kind="resumed", text="resumed")
MIGRATED = Cause(kind="migrated", text="migrated")
PREEMPTED = Cause(kind="preempted", text="preempted")
SUSPENDED = Cause(kind="suspended", text="suspended")
CANCELLED = Cause(kind="cancelled", text="cancelled")
COMPLETED = Cause(kind="completed", text="completed")
COMPLETED_WHILE_REQUEUED = Cause(kind="completed", text="completed while requeued")
RECOVERED = Cause(kind="recovered", text="recovered")


RECLAIMED = "preempted: reclaimed by queue "  # how a reclaim's cause text begins


def reclaimed(queue: str) -> Cause:
    """Preempted because queue `queue` took back the quota the job's queue had borrowed."""
    return Cause(kind="preempted", text=f"{RECLAIMED}{queue!r}")


def rejected(reason: str) -> Cause:
    return Cause(kind="rejected", text=reason)


def completed_on_left_node(node_id: str) -> Cause:
    """A run the job had left (its stop still on the way) did all its work."""
    return Cause(kind="completed", text=f"completed on {node_id}, a node it had left",
                 node_id=node_id)


def requeued(node_id: str, why: str) -> Cause:
    """A job taken off a node that was lost (`why` "lost") or whose agent restarted."""
    return Cause(kind="requeued", text=f"requeued: node {node_id} {why}", node_id=node_id,
                 fault="node-lost" if why == "lost" else "node-restarted")


def retry(node_id: str, failure: str, attempt: int, retries: int, at: float) -> Cause:
    return Cause(kind="retry", node_id=node_id, fault=failure_fault(failure),
                 text=f"trainer failed on {node_id} ({failure}); retry {attempt} of {retries} "
                      f"at {at:g}")


def recorded_restart(node_id: str, failure: str, attempt: int, at: float) -> Cause:
    """A failure the trace records, before its last run: the job runs again (the trace says it
    did), whatever its retry budget. The text reads as `retry`'s, so a version-1 log reads the
    same cause back."""
    return Cause(kind="retry", node_id=node_id, fault=failure_fault(failure),
                 text=f"trainer failed on {node_id} ({failure}); restart {attempt} as "
                      f"recorded, at {at:g}")


def recorded_failure(mark: float, iterations: int) -> str:
    """What a simulated node reports at a job's recorded failure mark (`JobSpec.fail_at`)."""
    return (f"{RECORDED_FAILURE}the trace's job failed here, at iteration {mark:g} of "
            f"{iterations}")


def failed(failure: str) -> Cause:
    return Cause(kind="failed", text=f"failed: {failure}", fault=failure_fault(failure))


def launch_timeout_failure(node_id: str, timeout_s: float) -> str:
    """Why a run its node never showed started was given up."""
    return f"{LAUNCH_TIMED_OUT}{node_id} within {timeout_s:g} s"
