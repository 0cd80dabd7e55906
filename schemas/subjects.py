"""Every NATS subject Loom uses, named in one place.

One JetStream stream (`STREAM`) captures `loom.>`, so a run's whole history can be replayed.
Node-specific traffic carries the node id as a token: `loom.node.<node_id>.command`.
"""

from __future__ import annotations

STREAM = "LOOM"
STREAM_SUBJECTS = ("loom.>",)

JOB_SUBMIT = "loom.jobs.submit"  # accepts msgpack envelopes and plain JSON (people, `nats pub`)
JOB_TRANSITION = "loom.jobs.transition"
JOB_FINISHED = "loom.jobs.finished"
JOB_PROGRESS = "loom.jobs.progress"  # trainers' reports (live clusters)
CYCLE_STARTED = "loom.sched.cycle"
PLAN_DECIDED = "loom.sched.plan"
OPERATOR = "loom.ops.command"  # cancel, suspend, resume, drain, set-policy (in the log)
NODE_STATUS = "loom.node.status"
NODE_INFO = "loom.node.info"  # a node agent's GPUs and topology, at start
NODE_HEARTBEAT = "loom.node.heartbeat"  # liveness and GPU telemetry, every few seconds
DEADLETTER_PREFIX = "loom.deadletter"


def node_command(node_id: str) -> str:
    return f"loom.node.{node_id}.command"


NODE_COMMAND_ALL = "loom.node.*.command"


def deadletter(service: str) -> str:
    return f"{DEADLETTER_PREFIX}.{service}"


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: `*` is one token, a trailing `>` is one or more tokens."""
    p = pattern.split(".")
    s = subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)
