"""Metrics aggregator: per-job outcomes, JCT statistics, utilisation and the decision digest."""

from domain.compiled import extend

extend(__path__, __name__)
