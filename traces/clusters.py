"""`load_cluster`: the 5-column cluster-spec CSV shared by Muri, Tiresias and ElasticFlow."""

from __future__ import annotations

from pathlib import Path

from schemas.cluster import ClusterSpec
from traces.bundled import resolve_cluster
from traces.errors import TraceError
from traces.readers._csv import read_table, validated

COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node")
# A typo such as 1000000 switches would otherwise allocate millions of NodeSpecs.
MAX_NODES = 65_536

_FIELDS = {"gpus": "num_gpu_p_node", "cpus": "num_cpu_p_node", "mem_gb": "mem_p_node"}


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """Load a bundled cluster spec or a cluster-spec CSV file; the spec is named after the file.

    Namespaced names (`muri/n8g8`, `tiresias/n32g4`, `elasticflow/n16g4`, `muri/testbed/n2g8`)
    pick one origin. A plain name (`n8g8`) resolves to the first origin that has it, in the
    order: Muri simulator, Tiresias, ElasticFlow, Muri testbed (cluster_exp). So "n8g8" is
    Muri's simulator cluster (92 CPUs, 520 GB per node) and "n1g8" is ElasticFlow's.
    See `bundled_clusters()` for every name.
    """
    path = resolve_cluster(name_or_path)
    table = read_table(path)
    if set(table.columns) != set(COLUMNS):
        raise TraceError(
            path,
            1,
            None,
            f"expected cluster-spec columns {', '.join(COLUMNS)}; got {', '.join(table.columns)}",
        )
    rows = list(table.rows())
    if len(rows) != 1:
        line = rows[1].line if len(rows) > 1 else 1
        raise TraceError(path, line, None, f"expected exactly one data row, got {len(rows)}")
    row = rows[0]
    switches = row.positive_int("num_switch")
    per_switch = row.positive_int("num_node_p_switch")
    gpus = row.positive_int("num_gpu_p_node")
    cpus = row.non_negative_int("num_cpu_p_node")
    mem_gb = row.non_negative_float("mem_p_node")
    if switches * per_switch > MAX_NODES:
        raise row.error(
            "num_node_p_switch",
            f"{switches} x {per_switch} nodes is more than the {MAX_NODES} supported",
        )
    return validated(
        row,
        _FIELDS,
        lambda: ClusterSpec.uniform(
            switches,
            per_switch,
            gpus,
            cpus_per_node=cpus,
            mem_gb_per_node=mem_gb,
            name=path.stem,
        ),
    )
