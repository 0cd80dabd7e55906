"""Loom's domain models and wire events.

Everything that crosses a process boundary is defined here: jobs, the cluster, plans and
placements, the `Status` that explains a waiting job, the versioned event envelope and the
subjects it travels on. Cores and shells import these; nothing here does I/O.
"""
