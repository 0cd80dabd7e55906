"""Job traces and cluster specs from the research schedulers Loom re-implements.

`load_trace` reads Muri, Tiresias, ElasticFlow, Microsoft ITP and Philly (Pollux) CSV traces and
Gavel's tab-separated traces into `schemas.job.JobSpec`s with every time in seconds (Gavel's
speeds come from a `ThroughputTable`), and streams the production traces (Philly's job log,
Helios, Acme, Alibaba PAI; `traces.production`), optionally cut by a `TraceFilter`;
`load_cluster` reads their cluster specs into a `ClusterSpec`. Both accept bundled names
(see `bundled_traces()`, `bundled_clusters()`; data and licences in `traces/data/`, see
ATTRIBUTION.md) or file paths. `traces.gavel_generator` draws synthetic traces exactly as
Gavel does (not imported here, so `python -m` can run it cleanly).
"""

from __future__ import annotations

from traces.bundled import BundledTrace, bundled_clusters, bundled_traces
from traces.clusters import load_cluster
from traces.errors import TraceError
from traces.filters import FilterError, TraceFilter, parse_filter
from traces.loader import Trace, load_trace
from traces.production import PRODUCTION_CLUSTERS, PRODUCTION_TRACES
from traces.throughputs import ThroughputTable, load_throughputs

__all__ = [
    "PRODUCTION_CLUSTERS",
    "PRODUCTION_TRACES",
    "BundledTrace",
    "FilterError",
    "ThroughputTable",
    "Trace",
    "TraceError",
    "TraceFilter",
    "bundled_clusters",
    "bundled_traces",
    "load_cluster",
    "load_throughputs",
    "load_trace",
    "parse_filter",
]
