"""Node agents: GPUs, trainer processes and telemetry on one node (a simulated node for runs)."""
