"""Why a job changed state, as a typed value on its transition (`loom.job.transition.v2`).

`text` is what people read, and exactly what version 1 of the event carried as its `cause`;
`kind`, `node_id` and `fault` are what programs act on (metrics count faults by `fault`, a
rebuilt scheduler holds a job back by `kind == "suspended"`). Version-1 transitions are read
through `Cause.from_v1`, which recovers the same typed value from the text.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from schemas.job import JobState

CauseKind = Literal[
    "admitted", "rejected", "started", "resumed", "migrated", "preempted", "suspended",
    "cancelled", "completed", "requeued", "retry", "failed", "recovered", "other",
]
FaultKind = Literal["node-lost", "node-restarted", "launch-refused", "launch-timeout",
                    "trainer-failed", "recorded-failure"]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
_PLAIN: frozenset[str] = frozenset(get_args(CauseKind)) - {"other"}

# What the node agent and the scheduler write in a failure that never ran (the agent's launch
# refusal, the scheduler's launch deadline); anything else is the trainer's own failure.
LAUNCH_REFUSED = "launch refused on "
LAUNCH_TIMED_OUT = "not started on node "
# What a simulated node agent writes when it replays a failure a production trace records
# (a job's `fail_at`): not a fault of the cluster, the trace's own history.
RECORDED_FAILURE = "recorded failure: "


class Cause(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: CauseKind
    text: str
    node_id: str | None = None
    fault: FaultKind | None = None

    @classmethod
    def from_v1(cls, text: str, state: JobState) -> Cause:
        """The typed cause of a version-1 transition, from its text."""
        if state is JobState.REJECTED:
            return cls(kind="rejected", text=text)
        if text in _PLAIN:
            return cls(kind=text, text=text)  # type: ignore[arg-type,unused-ignore]  # in _PLAIN
        if text.startswith("requeued: node "):
            node, why = text[len("requeued: node "):].rsplit(" ", 1)
            return cls(kind="requeued", text=text, node_id=node,
                       fault="node-lost" if why == "lost" else "node-restarted")
        if text.startswith("trainer failed on "):
            node = text[len("trainer failed on "):].split(" ", 1)[0]
            return cls(kind="retry", text=text, node_id=node, fault=failure_fault(text))
        if text.startswith("failed: "):
            return cls(kind="failed", text=text, fault=failure_fault(text))
        if text.startswith("completed"):
            return cls(kind="completed", text=text)
        return cls(kind="other", text=text)


def failure_fault(failure: str) -> FaultKind:
    """The fault a failed run's reason records: a launch its node refused, one never shown
    started, a failure the trace records (replayed), or the trainer's own failure."""
    if LAUNCH_REFUSED in failure:
        return "launch-refused"
    if LAUNCH_TIMED_OUT in failure:
        return "launch-timeout"
    if RECORDED_FAILURE in failure:
        return "recorded-failure"
    return "trainer-failed"
