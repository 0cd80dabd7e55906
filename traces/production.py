"""Production traces: where each is published, and the clusters they ran on.

The traces themselves are too large to bundle (and are not Loom's to ship); users download
them and point `--trace` at the files (see docs/traces/). What Loom does bundle are cluster
specs at the sizes the traces' papers report, built here rather than shipped as files, and
the cluster a downloaded machine table describes (`cluster_from_machines`).

None of these traces records the network: racks of `NODES_PER_SWITCH` machines of one kind
stand in for it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from schemas.cluster import DEFAULT_GPU_TYPE, ClusterSpec, NodeSpec
from traces.errors import TraceError
from traces.readers import pai, philly_log
from traces.readers._csv import validated
from traces.readers.philly_log import Machine

NODES_PER_SWITCH = 32
LICENCE = "CC-BY-4.0"


@dataclass(frozen=True)
class ProductionTrace:
    """A production trace Loom reads: its reader, origin, licence and docs page (which says
    what to point --trace and --cluster at)."""

    format: str
    title: str
    source: str
    docs: str
    licence: str = LICENCE


PRODUCTION_TRACES: tuple[ProductionTrace, ...] = (
    ProductionTrace(
        "philly-log", "Philly (Microsoft, ATC'19), 2017 job log",
        "https://github.com/msr-fiddle/philly-traces (trace-data.tar.gz)",
        "docs/traces/philly.md"),
    ProductionTrace(
        "helios", "Helios (SenseTime, SC'21): Earth, Saturn, Uranus, Venus",
        "https://github.com/S-Lab-System-Group/HeliosData (data.zip)",
        "docs/traces/helios.md"),
    ProductionTrace(
        "acme", "Acme (Shanghai AI Lab, NSDI'24): Seren, Kalos",
        "https://github.com/InternLM/AcmeTrace (data/job_trace/)",
        "docs/traces/acme.md"),
    ProductionTrace(
        "alibaba-pai", "Alibaba PAI (NSDI'22), cluster-trace-gpu-v2020",
        "https://github.com/alibaba/clusterdata (cluster-trace-gpu-v2020)",
        "docs/traces/alibaba-pai.md"),
)


@dataclass(frozen=True)
class ProductionCluster:
    """A production cluster at the size its paper reports: groups of (machines, GPUs each)."""

    name: str
    groups: tuple[tuple[int, int], ...]
    gpu_type: str
    source: str

    @property
    def gpus(self) -> int:
        return sum(m * g for m, g in self.groups)

    @property
    def machines(self) -> int:
        return sum(m for m, _ in self.groups)

    def spec(self) -> ClusterSpec:
        nodes = [(f"n{i}", gpus, self.gpu_type, 0, 0.0)
                 for i, gpus in enumerate(g for m, g in self.groups for _ in range(m))]
        return _racked(self.name.rsplit("/", 1)[-1], nodes)


def _helios(cluster: str, gpus: int) -> ProductionCluster:
    return ProductionCluster(
        f"helios/{cluster.lower()}", ((gpus // 8, 8),), DEFAULT_GPU_TYPE,
        f"Helios {cluster}: {gpus:,} GPUs, 8 per node (Hu et al., SC'21)")


PRODUCTION_CLUSTERS: tuple[ProductionCluster, ...] = (
    ProductionCluster(
        "philly", ((321, 2), (231, 8)), DEFAULT_GPU_TYPE,
        "Philly: 2,490 GPUs on 552 machines of 2 or 8 GPUs (Jeon et al., ATC'19), split "
        "321 x 2 + 231 x 8; --cluster cluster_machine_list reads the exact machines"),
    _helios("Earth", 1152),
    _helios("Saturn", 2096),
    _helios("Uranus", 1056),
    _helios("Venus", 1064),
    ProductionCluster(
        "acme/seren", ((286, 8),), "a100",
        "Acme Seren: 2,288 A100 GPUs, 8 per node (Hu et al., NSDI'24)"),
    ProductionCluster(
        "acme/kalos", ((302, 8),), "a100",
        "Acme Kalos: 2,416 A100 GPUs, 8 per node (Hu et al., NSDI'24)"),
)
_CLUSTERS_BY_NAME = {c.name: c for c in PRODUCTION_CLUSTERS}


def production_cluster(name: str) -> ClusterSpec | None:
    """The bundled production cluster of that name (`philly`, `helios/earth`, ...), or None."""
    cluster = _CLUSTERS_BY_NAME.get(name)
    return None if cluster is None else cluster.spec()


def machine_table(path: Path) -> ClusterSpec | None:
    """The cluster a downloaded machine table describes (Philly's `cluster_machine_list`,
    PAI's `pai_machine_spec.csv`), or None if `path` is neither."""
    if philly_log.is_machine_list(path):
        return cluster_from_machines(path, philly_log.machines(path))
    if pai.is_machine_spec(path):
        return cluster_from_machines(path, pai.machines(path))
    return None


def cluster_from_machines(path: Path, machines: Sequence[Machine]) -> ClusterSpec:
    """A cluster of the listed machines, named after the file, racked by kind (GPU type and
    count) in file order."""
    if not machines:
        raise TraceError(path, None, None, "lists no machine with GPUs")
    seen: dict[str, int] = {}
    nodes = []
    for m in machines:
        first = seen.setdefault(m.node_id, m.where.line)
        if first != m.where.line:
            raise m.where.error(m.columns["node_id"], f"machine {m.node_id!r} is listed twice "
                                                      f"(first on line {first})")
        gpu_type = m.gpu_type or DEFAULT_GPU_TYPE
        validated(m.where, m.columns, functools.partial(
            NodeSpec, node_id=m.node_id, switch_id="s0", gpus=m.gpus, gpu_type=gpu_type,
            cpus=m.cpus, mem_gb=m.mem_gb))
        nodes.append((m.node_id, m.gpus, gpu_type, m.cpus, m.mem_gb))
    try:
        return _racked(path.stem, nodes)
    except ValueError as exc:  # over the cluster size limits
        message = exc.errors(include_url=False)[0]["msg"] if isinstance(exc, ValidationError) \
            else str(exc)
        raise TraceError(path, None, None, message.removeprefix("Value error, ")) from None


def _racked(name: str, nodes: Sequence[tuple[str, int, str, int, float]]) -> ClusterSpec:
    """Nodes grouped by (GPU type, GPUs) in order of first appearance, `NODES_PER_SWITCH` to
    a switch."""
    kinds: dict[tuple[str, int], list[tuple[str, int, str, int, float]]] = {}
    for node in nodes:
        kinds.setdefault((node[2], node[1]), []).append(node)
    specs: list[NodeSpec] = []
    switch = 0
    for group in kinds.values():
        for start in range(0, len(group), NODES_PER_SWITCH):
            for node_id, gpus, gpu_type, cpus, mem_gb in group[start:start + NODES_PER_SWITCH]:
                specs.append(NodeSpec(node_id=node_id, switch_id=f"s{switch}", gpus=gpus,
                                      gpu_type=gpu_type, cpus=cpus, mem_gb=mem_gb))
            switch += 1
    return ClusterSpec(name=name, nodes=tuple(specs))
