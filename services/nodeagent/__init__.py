"""Node agents: GPUs, trainer processes and telemetry on one node (a simulated node for runs)."""

from domain.compiled import extend

extend(__path__, __name__)
