"""Why a job changed state, as its transitions say it: the causes the scheduler writes for
faults, and the kind of fault each records (what metrics count). Shared by the scheduler,
which writes them, and the metrics service, which reads them."""

from __future__ import annotations


def requeue_cause(node_id: str, why: str) -> str:
    """The transition cause of a job taken off a node that was lost or whose agent restarted."""
    return f"requeued: node {node_id} {why}"


def retry_cause(node_id: str, failure: str, attempt: int, retries: int, at: float) -> str:
    return f"trainer failed on {node_id} ({failure}); retry {attempt} of {retries} at {at:g}"


def failed_cause(failure: str) -> str:
    return f"failed: {failure}"


FAULT_KINDS = ("node-lost", "node-restarted", "launch-refused", "launch-timeout",
               "trainer-failed")


def launch_timeout_failure(node_id: str, timeout_s: float) -> str:
    """Why a run its node never showed started was given up."""
    return f"not started on node {node_id} within {timeout_s:g} s"


def fault_kind(cause: str) -> str | None:
    """Which fault a transition's cause records (for metrics), if any: a lost or restarted
    node, a launch its node refused (the agent's "launch refused on <node>: ...") or never
    showed started, or a trainer that failed once running."""
    if cause.startswith("requeued: node "):
        return "node-" + cause.rsplit(" ", 1)[1]  # node-lost | node-restarted
    if cause.startswith(("trainer failed on ", "failed: ")):
        if "launch refused on " in cause:
            return "launch-refused"
        if "not started on node " in cause:
            return "launch-timeout"
        return "trainer-failed"
    return None
