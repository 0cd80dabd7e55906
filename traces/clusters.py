"""`load_cluster`: a cluster from a bundled name, a cluster-spec CSV (Muri, Tiresias,
ElasticFlow), a JSON `ClusterSpec`, or GPU-type counts such as `36:36:36` (Gavel's V100:P100:K80).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import ValidationError

from schemas.cluster import MAX_NODES, ClusterSpec, check_size
from schemas.userinput import DuplicateKeyError, describe, loads_unique
from traces.bundled import resolve_cluster
from traces.errors import TraceError
from traces.production import machine_table, production_cluster
from traces.readers._csv import read_table, validated

COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node")
# The limits are the cluster model's, the same for every syntax (schemas.cluster.check_size).

_FIELDS = {"gpus": "num_gpu_p_node", "cpus": "num_cpu_p_node", "mem_gb": "mem_p_node"}


# Gavel's `-c v100:p100:k80` order.
GAVEL_TYPES = ("v100", "p100", "k80")
_COUNTS = re.compile(r"^\d+(:\d+){0,2}$")


def parse_type_counts(text: str) -> dict[str, int]:
    """`36:36:36` → {"v100": 36, "p100": 36, "k80": 36}; missing trailing types count 0."""
    counts = [int(c) for c in text.split(":")]
    return dict(zip(GAVEL_TYPES, counts, strict=False))


def load_cluster(name_or_path: str | Path, gpus_per_server: str | int = 4) -> ClusterSpec:
    """Load a cluster; a CSV spec is named after its file.

    `V100:P100:K80` counts (`36:36:36`, `500:0:0`) build a heterogeneous cluster of servers
    with `gpus_per_server` GPUs (one number, or one per type as `4:4:4`); types with no GPUs
    are left out. A `.json` file holds a `ClusterSpec` (nodes with their GPU type).

    Namespaced names (`muri/n8g8`, `tiresias/n32g4`, `elasticflow/n16g4`, `muri/testbed/n2g8`)
    pick one origin. A plain name (`n8g8`) resolves to the first origin that has it, in the
    order: Muri simulator, Tiresias, ElasticFlow, Muri testbed (cluster_exp). So "n8g8" is
    Muri's simulator cluster (92 CPUs, 520 GB per node) and "n1g8" is ElasticFlow's.
    See `bundled_clusters()` for every name.

    Production clusters at their papers' sizes are named `philly`, `helios/earth`,
    `helios/saturn`, `helios/uranus`, `helios/venus`, `acme/seren` and `acme/kalos`
    (`traces.production`); Philly's `cluster_machine_list` and Alibaba PAI's
    `pai_machine_spec.csv` are read as the clusters they list.
    """
    text = str(name_or_path)
    if _COUNTS.match(text):
        return _from_counts(text, gpus_per_server)
    if text.endswith(".json"):
        return _from_json(Path(text))
    production = production_cluster(text)
    if production is not None:
        return production
    path = resolve_cluster(name_or_path)
    machines = machine_table(path)
    if machines is not None:
        return machines
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
    try:
        check_size(switches * per_switch, switches * per_switch * gpus)
    except ValueError as exc:
        nodes = switches * per_switch
        field = "num_gpu_p_node" if nodes <= MAX_NODES else "num_node_p_switch"
        raise row.error(field, f"{switches} x {per_switch} nodes: {exc}") from None
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


def _from_counts(text: str, gpus_per_server: str | int) -> ClusterSpec:
    counts = {t: c for t, c in parse_type_counts(text).items() if c > 0}
    per: dict[str, int] | int
    if isinstance(gpus_per_server, int) or ":" not in gpus_per_server:
        try:
            per = int(gpus_per_server)
        except ValueError:
            raise ValueError(f"--gpus-per-server {gpus_per_server!r}: expected N or N:N:N"
                             ) from None
    else:
        if not _COUNTS.match(gpus_per_server):
            raise ValueError(f"--gpus-per-server {gpus_per_server!r}: expected N or N:N:N")
        per = {t: c for t, c in parse_type_counts(gpus_per_server).items() if t in counts}
        missing = [t for t in counts if per.get(t, 0) < 1]
        if missing:
            raise ValueError(f"--gpus-per-server {gpus_per_server!r}: no size for {missing}")
    try:
        return ClusterSpec.heterogeneous(counts, per)
    except ValueError as exc:
        raise ValueError(f"cluster {text!r}: {exc}") from None


def _from_json(path: Path) -> ClusterSpec:
    """A `ClusterSpec` as JSON, taken as typed (strict: `"gpus": "8"` is refused) and with
    each key once."""
    try:
        raw = path.read_bytes()
        loads_unique(raw)
        return ClusterSpec.model_validate_json(raw, strict=True)
    except OSError as exc:
        if path.is_dir():
            raise TraceError(path, 1, None, "is a directory, not a cluster file") from None
        raise TraceError(path, 1, None, f"cannot read cluster file: {exc.strerror}") from None
    except (DuplicateKeyError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(path, 1, None, f"not valid JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"]))
        problem = describe(first, ClusterSpec.model_fields).split(": ", 1)[-1]
        raise TraceError(path, 1, where or None, problem) from None
