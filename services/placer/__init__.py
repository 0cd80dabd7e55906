"""Topology-aware placement: turn GPU counts into GPUs (core) and bind plans to nodes (shell)."""
