"""Pollux (OSDI'21): the policy (`policy`), its objective and exact optimiser over GPU counts
(`optimiser`), and the packing of those counts onto nodes (`packing`)."""

from policies.pollux.policy import Pollux

__all__ = ["Pollux"]
