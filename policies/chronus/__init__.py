"""Chronus (SoCC'21): the lease problem (`lease`), its MILP and solver (`milp`), per-term
layout and admission packing (`packing`), and the policy (`policy`). docs/policies/chronus.md
explains them."""

from policies.chronus.policy import Chronus

__all__ = ["Chronus"]
