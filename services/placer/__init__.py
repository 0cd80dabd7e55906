"""Topology-aware placement: turn GPU counts into GPUs (core) and bind plans to nodes (shell)."""

from domain.compiled import extend

extend(__path__, __name__)
