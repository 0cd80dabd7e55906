"""Every NATS subject Loom uses, named in one place.

On a live cluster one JetStream stream (`STREAM`) holds the run's history, everything on
`loom.>` but dead letters, so it can be replayed; dead letters (a truncated copy of what was
refused, with the reason) have a bounded stream of their own (`DEADLETTER_STREAM`), so that
refused input cannot grow the history. A simulation keeps both in its one stream.
Everything a node agent says travels on its own subjects, `loom.node.<node_id>.<kind>`: the
server lets node `n0`'s user publish only `loom.node.n0.>`, so the subject proves which node
speaks, and a subscriber checks the body names the same node (`schemas.codec.check_origin`).
The names below without a node (`NODE_STATUS`, ...) are the patterns services subscribe to.
"""

from __future__ import annotations

STREAM = "LOOM"
STREAM_SUBJECTS = ("loom.jobs.>", "loom.sched.>", "loom.ops.>", "loom.node.>")
# Every subject Loom uses, dead letters included: what a simulation's one stream holds (and a
# live LOOM made before dead letters had their own), and what reads a whole stream back.
EVERY_SUBJECT = "loom.>"
DEADLETTER_STREAM = "LOOM_DEADLETTER"

JOB_SUBMIT = "loom.jobs.submit"  # accepts msgpack envelopes and plain JSON (people, `nats pub`)
JOB_TRANSITION = "loom.jobs.transition"
CYCLE_STARTED = "loom.sched.cycle"
PLAN_DECIDED = "loom.sched.plan"
START_FORECAST = "loom.sched.forecast"  # expected starts of waiting jobs (observations)
QUEUE_STATUS = "loom.sched.queues"  # the queues' quotas and use after a cycle (observations)
OPERATOR = "loom.ops.command"  # cancel, suspend, resume, drain, set-policy (in the log)
DEADLETTER_PREFIX = "loom.deadletter"
# Request/reply, outside `loom.>` (never stored): `loom queues` asks the scheduler for its
# queues' status (msgpack `loom.queue.status.v1`). `loomctl.<service>.state` is the other.
QUEUES_REQUEST = "loomctl.scheduler.queues"
DEADLETTER_SUBJECTS = (f"{DEADLETTER_PREFIX}.>",)

# What node agents publish, one token per kind (the placer's commands to them are the sixth).
FINISHED, PROGRESS, STATUS, INFO, HEARTBEAT, COMMAND = (
    "finished", "progress", "status", "info", "heartbeat", "command")
JOB_FINISHED = "loom.node.*.finished"  # a run ended: completed, failed or refused
JOB_PROGRESS = "loom.node.*.progress"  # trainers' reports (live clusters)
NODE_STATUS = "loom.node.*.status"  # progress of the jobs a command stopped
NODE_INFO = "loom.node.*.info"  # a node agent's GPUs and topology, at start
NODE_HEARTBEAT = "loom.node.*.heartbeat"  # liveness and GPU telemetry, every few seconds
NODE_COMMAND_ALL = "loom.node.*.command"
NODE_KINDS = (FINISHED, PROGRESS, STATUS, INFO, HEARTBEAT, COMMAND)

# Until 2026-11 nodes shared these subjects and named themselves only in the body; replay
# reads logs recorded then through `current_subject`.
LEGACY_NODE_SUBJECTS = {
    "loom.jobs.finished": FINISHED,
    "loom.jobs.progress": PROGRESS,
    "loom.node.status": STATUS,
    "loom.node.info": INFO,
    "loom.node.heartbeat": HEARTBEAT,
}


def node_subject(node_id: str, kind: str) -> str:
    return f"loom.node.{node_id}.{kind}"


def node_command(node_id: str) -> str:
    return node_subject(node_id, COMMAND)


def node_of(subject: str) -> str | None:
    """The node a node-scoped subject belongs to (None for any other subject)."""
    parts = subject.split(".")
    if len(parts) == 4 and parts[:2] == ["loom", "node"] and parts[3] in NODE_KINDS:
        return parts[2]
    return None


def current_subject(subject: str, node_id: str | None) -> str:
    """The subject a message recorded on a legacy shared subject has today."""
    kind = LEGACY_NODE_SUBJECTS.get(subject)
    return subject if kind is None or node_id is None else node_subject(node_id, kind)


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
