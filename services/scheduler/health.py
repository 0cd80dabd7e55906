"""Node health as the scheduler acts on it: each heartbeat's report (`NodeHealth`, from the
node agent's doctor) cordons the node or takes single GPUs out of service, and lifts either
when a later report no longer fails (`domain.health.verdict` is the rule).

- A node whose own checks fail is cordoned as `loom drain` cordons it (`core.drained`, with
  the reason kept apart from an operator's: `NodeFaults.cordons`): no new work lands there,
  running jobs go on.
- A GPU with uncorrectable ECC errors, a fatal XID, a failed row remap, past its shutdown
  temperature or lost from the bus is taken out alone (`Topology.take_out`): the placement
  gives it to no new job, and the node's other GPUs go on taking work.

The report travels on the node's own heartbeat subject, so only the node speaks for itself
(`schemas.codec.check_origin` refuses a body naming another node), and a report naming a GPU
the node has not is refused whole. A cycle is asked for whenever what may take work changes.
Health is not rebuilt from the stream after a restart: the next heartbeat, seconds away,
brings it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from domain.health import describe, verdict
from schemas.events import NodeHealth
from services.runtime.effects import Effect
from services.scheduler.liveness import HEALTH

if TYPE_CHECKING:
    from services.scheduler.core import SchedulerCore


def on_health(core: SchedulerCore, node: str, health: NodeHealth | None,
              now: float) -> list[Effect]:
    """Apply a node's latest report; raises ValueError (before changing anything) for a
    report the node could not have made."""
    faults = core.faults
    if health is None and not faults.cordoned_by(node, HEALTH) and node not in faults.gpus_out:
        return []  # the common case of an agent that runs no checks: nothing to undo
    size = core.topology.nodes[core.topology.index[node]][2]
    found = verdict(health, size)
    changed = False
    if found.node is not None:
        changed = faults.cordon(core.drained, node, HEALTH, found.node)
    elif faults.cordoned_by(node, HEALTH):
        faults.uncordon(core.drained, node, HEALTH)
        changed = True  # even if the operator's drain remains: the state people see moved
    out = dict(found.gpus)
    if set(out) != set(faults.gpus_out.get(node, {})):
        core.topology.take_out(node, out)
        changed = True
    if out:
        faults.gpus_out[node] = out
    else:
        faults.gpus_out.pop(node, None)
    warned = "; ".join(describe(p) for p in (health.problems if health else ())
                       if p.status == "warn")
    if warned:
        faults.warnings[node] = warned
    else:
        faults.warnings.pop(node, None)
    return core.request_cycle(now, "health") if changed else []
