"""Muri (SIGCOMM'22): the policy (`policy`: ranking, candidates, autopack, placement) and its
grouping of jobs by repeated maximum-weight matching (`matching`)."""

from policies.muri.policy import Muri, MuriL, MuriS

__all__ = ["Muri", "MuriL", "MuriS"]
