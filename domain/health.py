"""What a node's health report means for scheduling: the one rule the scheduler cordons by and
the metrics service reports by (`NodeHealth`, sent with each heartbeat; docs/doctor.md).

- A failed check about one GPU (uncorrectable ECC errors, a fatal XID, a failed row remap, a
  GPU past its shutdown temperature or lost from the bus) takes that GPU out of service: no
  new work lands on it; the node's other GPUs go on taking work.
- Any other failed check (the driver, CUDA in torch, NCCL, MPS, the checkpoint directory,
  NATS, the clock) cordons the whole node, as `loom drain` does: no new work; running jobs
  go on.
- Warnings are shown (`loom status`, Prometheus) and change nothing.

The latest report is the truth: a check that passes again lifts what its failure imposed,
and a heartbeat with no report (an agent that runs no checks) imposes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from schemas.events import HealthProblem, NodeHealth


@dataclass(frozen=True, slots=True)
class Verdict:
    node: str | None = None  # why the node takes no new work; None: it may take work
    gpus: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))  # GPUs out

    @property
    def healthy(self) -> bool:
        return self.node is None and not self.gpus


def verdict(health: NodeHealth | None, gpus: int) -> Verdict:
    """The verdict on a node of `gpus` GPUs; ValueError for a GPU index the node has not (a
    buggy or forged report, refused whole so that nothing of it is believed)."""
    if health is None:
        return Verdict()
    node: list[str] = []
    out: dict[int, list[str]] = {}
    for p in health.problems:
        if p.gpu is not None and p.gpu >= gpus:
            raise ValueError(f"health report names GPU {p.gpu} of a node with {gpus} GPUs")
        if p.status != "fail":
            continue
        if p.gpu is None:
            node.append(describe(p))
        else:
            out.setdefault(p.gpu, []).append(describe(p))
    return Verdict("; ".join(node) or None,
                   MappingProxyType({g: "; ".join(why) for g, why in sorted(out.items())}))


def describe(problem: HealthProblem) -> str:
    """A problem in one line: `ecc: 3 uncorrectable ECC errors ...`."""
    return f"{problem.check}: {problem.detail}" if problem.detail else problem.check
