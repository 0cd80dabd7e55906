"""What one check of a node's health reports (`Check`), and the checks there are (`TITLES`).

A module of its own because the doctor (`services.nodeagent.doctor`), the per-GPU checks
(`services.nodeagent.gpu_checks`) and the node agent's monitor
(`services.nodeagent.health_monitor`) all make or read these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "skip"]

# Every check, in the order they run and are shown (`services.nodeagent.doctor.CHECKS`).
TITLES: dict[str, str] = {
    "driver": "NVIDIA driver and NVML reachable",
    "gpus": "GPUs visible (UUID, memory)",
    "ecc": "ECC errors",
    "memory": "retired pages / row remapping",
    "xid": "XID errors",
    "temperature": "temperature",
    "throttle": "clock throttling",
    "dcgm": "DCGM present",
    "torch": "torch sees CUDA, versions match the driver",
    "gloo": "gloo usable",
    "nccl": "NCCL usable",
    "mps": "MPS control daemon startable, its directories writable",
    "checkpoint": "checkpoint directory writable, with room",
    "nats": "NATS reachable with the configured credentials",
    "clock": "clock skew against the NATS server",
}


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # one of TITLES
    status: Status
    measured: str
    fix: str = ""
    gpu: int | None = None  # the GPU it is about (index on the node); None: the node

    @property
    def title(self) -> str:
        return TITLES[self.name]

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.name, "title": self.title, "gpu": self.gpu,
                "status": self.status, "measured": self.measured, "fix": self.fix}
