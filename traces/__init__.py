"""Job traces and cluster specs from the research schedulers Loom re-implements.

`load_trace` reads Muri, Tiresias, ElasticFlow, Microsoft ITP and Philly (Pollux) CSV traces
into `schemas.job.JobSpec`s with every time in seconds; `load_cluster` reads their cluster-spec
CSVs into a `ClusterSpec`. Both accept bundled names (see `bundled_traces()`,
`bundled_clusters()`; data and licences in `traces/data/`, see ATTRIBUTION.md) or file paths.
"""

from __future__ import annotations

from traces.bundled import BundledTrace, bundled_clusters, bundled_traces
from traces.clusters import load_cluster
from traces.errors import TraceError
from traces.loader import Trace, load_trace

__all__ = [
    "BundledTrace",
    "Trace",
    "TraceError",
    "bundled_clusters",
    "bundled_traces",
    "load_cluster",
    "load_trace",
]
