"""The cluster: switches → nodes → GPUs, each GPU of a type."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

NODE_ID_PATTERN = r"^[A-Za-z0-9_\-]+$"
NodeId = Annotated[str, Field(min_length=1, max_length=64, pattern=NODE_ID_PATTERN)]
DEFAULT_GPU_TYPE = "gpu"

# The largest cluster Loom builds, whatever the syntax that asks for it (a bundled name, a
# cluster-spec CSV, a JSON spec, or GPU counts such as 36:36:36): a typo such as a million
# switches, or a GPU count meant for another flag, is refused before anything is allocated.
MAX_NODES = 65_536
MAX_NODE_GPUS = 64
MAX_CLUSTER_GPUS = 524_288  # 65,536 nodes of 8 GPUs
LIMITS_TEXT = (f"at most {MAX_NODES:,} nodes, {MAX_NODE_GPUS} GPUs per node and "
               f"{MAX_CLUSTER_GPUS:,} GPUs in all")


def check_size(nodes: int, gpus: int) -> None:
    """Refuse a cluster over the limits (ValueError naming the limit and the size asked)."""
    if nodes > MAX_NODES:
        raise ValueError(f"{nodes:,} nodes is more than the {MAX_NODES:,} Loom supports "
                         f"(limits: {LIMITS_TEXT})")
    if gpus > MAX_CLUSTER_GPUS:
        raise ValueError(f"{gpus:,} GPUs is more than the {MAX_CLUSTER_GPUS:,} Loom supports "
                         f"(limits: {LIMITS_TEXT})")


class NodeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: NodeId
    switch_id: NodeId
    gpus: int = Field(ge=0, le=MAX_NODE_GPUS)
    gpu_type: str = DEFAULT_GPU_TYPE
    cpus: int = Field(default=0, ge=0)
    mem_gb: float = Field(default=0.0, ge=0)
    gpu_price_per_hour: float | None = Field(default=None, ge=0)  # $ per GPU, for cost policies


class ClusterSpec(BaseModel):
    """A cluster as a list of nodes; node ids are NATS-subject-safe tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "cluster"
    nodes: tuple[NodeSpec, ...] = Field(min_length=1, max_length=MAX_NODES)

    @model_validator(mode="after")
    def _unique_ids(self) -> ClusterSpec:
        check_size(len(self.nodes), sum(n.gpus for n in self.nodes))
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("node ids must be unique")
        return self

    @classmethod
    def uniform(
        cls,
        switches: int,
        nodes_per_switch: int,
        gpus_per_node: int,
        *,
        gpu_type: str = DEFAULT_GPU_TYPE,
        cpus_per_node: int = 0,
        mem_gb_per_node: float = 0.0,
        name: str | None = None,
    ) -> ClusterSpec:
        check_size(switches * nodes_per_switch, switches * nodes_per_switch * gpus_per_node)
        nodes = tuple(
            NodeSpec(
                node_id=f"n{s * nodes_per_switch + i}",
                switch_id=f"s{s}",
                gpus=gpus_per_node,
                gpu_type=gpu_type,
                cpus=cpus_per_node,
                mem_gb=mem_gb_per_node,
            )
            for s in range(switches)
            for i in range(nodes_per_switch)
        )
        return cls(name=name or f"n{switches * nodes_per_switch}g{gpus_per_node}", nodes=nodes)

    @classmethod
    def heterogeneous(
        cls, gpus_by_type: dict[str, int], gpus_per_server: dict[str, int] | int = 4,
        *, name: str | None = None,
    ) -> ClusterSpec:
        """Servers of each GPU type (in the given order), one switch per type.

        `gpus_by_type` {"v100": 36, "p100": 36, "k80": 36} with 4 GPUs per server gives nine
        servers of each type, `v100-0` … `k80-8`, as Gavel's simulator builds its cluster.
        """
        nodes: list[NodeSpec] = []
        sizes: dict[str, int] = {}
        for gpu_type, count in gpus_by_type.items():
            per = gpus_per_server if isinstance(gpus_per_server, int) else \
                gpus_per_server[gpu_type]
            if per < 1:
                raise ValueError(f"{gpu_type}: GPUs per server must be >= 1, not {per}")
            if per > MAX_NODE_GPUS:
                raise ValueError(f"{gpu_type}: {per} GPUs per server is more than the "
                                 f"{MAX_NODE_GPUS} Loom supports (limits: {LIMITS_TEXT})")
            if count % per:
                raise ValueError(f"{gpu_type}: {count} GPUs do not fill servers of {per}")
            sizes[gpu_type] = per
        check_size(sum(c // sizes[t] for t, c in gpus_by_type.items()),
                   sum(gpus_by_type.values()))
        for gpu_type, count in gpus_by_type.items():
            per = sizes[gpu_type]
            nodes += [NodeSpec(node_id=f"{gpu_type}-{i}", switch_id=f"sw-{gpu_type}", gpus=per,
                               gpu_type=gpu_type) for i in range(count // per)]
        if not nodes:
            raise ValueError("a cluster needs at least one GPU")
        label = ":".join(str(c) for c in gpus_by_type.values())
        return cls(name=name or f"{label}", nodes=tuple(nodes))

    @cached_property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @cached_property
    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.gpu_type] = out.get(n.gpu_type, 0) + n.gpus
        return out

    @cached_property
    def switches(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.switch_id for n in self.nodes))

    def node(self, node_id: str) -> NodeSpec:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)
