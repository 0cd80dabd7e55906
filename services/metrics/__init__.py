"""Metrics aggregator: per-job outcomes, JCT statistics, utilisation and the decision digest."""
