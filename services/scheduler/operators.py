"""Operators' commands: cancel, suspend and resume a job, drain and undrain a node, switch the
policy. A command that cannot apply raises (the shell dead-letters it with the reason)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from domain import causes
from schemas.events import OperatorCommand, Stop
from schemas.job import JobState
from schemas.status import Status, StatusCode
from services.runtime.effects import CancelTimer, Effect
from services.scheduler.jobs import JobRecord
from services.scheduler.liveness import OPERATOR, retry_key

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore


def on_command(core: SchedulerCore, cmd: OperatorCommand, now: float) -> list[Effect]:
    if cmd.command == "set-policy":
        core.switch_policy(str(cmd.policy))
        return core.request_cycle(now, "policy")
    if cmd.command in ("drain", "undrain"):
        return _drain(core, cmd.command, str(cmd.node_id), cmd.requested_by, now)
    jid = str(cmd.job_id)
    rec = core.jobs.get(jid)
    if rec is None or rec.state is None or rec.state.terminal:
        raise ValueError(f"{cmd.command}: no active job {jid!r}")
    held = core.jobs.held
    if cmd.command == "resume":
        if jid not in held:
            return []
        held.discard(jid)
        core.show(rec)
        return core.request_cycle(now, "resume")
    if jid in held and cmd.command == "suspend":
        return []
    effects = _take_off(core, rec, cmd.command, now)
    if jid in core.faults.backoff:  # out of sight already; the operator decides now
        del core.faults.backoff[jid]
        effects.append(CancelTimer(retry_key(jid)))
    elif jid not in held:
        core.hide(jid)
    if cmd.command == "suspend":
        held.add(jid)
    else:  # cancel
        held.discard(jid)
        rec.ended_at = now
        rec.status = Status(code=StatusCode.CANCELLED, reason=f"cancelled by {cmd.requested_by}",
                            decided_by="operator")
        effects.append(core.transition(rec, JobState.FAILED, causes.CANCELLED, now))
    return effects + core.request_cycle(now, cmd.command)


def _drain(core: SchedulerCore, command: str, node: str, by: str, now: float
           ) -> list[Effect]:
    """The operator's cordon, kept apart from the node's health (`NodeFaults.cordons`): an
    undrain leaves a node whose checks fail cordoned."""
    if node not in core.topology.index:
        raise ValueError(f"{command}: no node {node!r} in the cluster")
    drain(core, command, node, by)
    return core.request_cycle(now, command)


def drain(core: SchedulerCore, command: str, node: str, by: str) -> None:
    """`drain` or `undrain` `node` for an operator (`by`); also replayed by recovery."""
    if command == "drain":
        core.faults.cordon(core.drained, node, OPERATOR, f"drained by {by}")
    else:
        core.faults.uncordon(core.drained, node, OPERATOR)


def _take_off(core: SchedulerCore, rec: JobRecord, why: str, now: float) -> list[Effect]:
    """Stop a running job now (outside a cycle); nothing for a waiting one."""
    jid = rec.spec.job_id
    if jid not in core.jobs.running:
        return []
    rec.account(now, 0.0)  # the node reports the exact figure when it stops
    core.jobs.clear_running(jid)
    rec.unplace()
    effects: list[Effect] = [core.plan_out(stops=[Stop(job_id=jid, reason=why)])]
    if why == "suspend":
        rec.preemptions += 1
        effects.append(core.transition(rec, JobState.PREEMPTED, causes.SUSPENDED, now))
    return effects
