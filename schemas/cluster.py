"""The cluster: switches → nodes → GPUs, each GPU of a type."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

NodeId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
DEFAULT_GPU_TYPE = "gpu"


class NodeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: NodeId
    switch_id: NodeId
    gpus: int = Field(ge=0, le=64)
    gpu_type: str = DEFAULT_GPU_TYPE
    cpus: int = Field(default=0, ge=0)
    mem_gb: float = Field(default=0.0, ge=0)
    gpu_price_per_hour: float | None = Field(default=None, ge=0)  # $ per GPU, for cost policies


class ClusterSpec(BaseModel):
    """A cluster as a list of nodes; node ids are NATS-subject-safe tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "cluster"
    nodes: tuple[NodeSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> ClusterSpec:
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
        for gpu_type, count in gpus_by_type.items():
            per = gpus_per_server if isinstance(gpus_per_server, int) else \
                gpus_per_server[gpu_type]
            if per < 1:
                raise ValueError(f"{gpu_type}: GPUs per server must be >= 1, not {per}")
            if count % per:
                raise ValueError(f"{gpu_type}: {count} GPUs do not fill servers of {per}")
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
