"""One set of cluster limits whatever the syntax: GPU counts, cluster-spec CSV or JSON spec
are refused at once above 65,536 nodes or 524,288 GPUs (before anything is allocated), and a
JSON spec is read as typed, each key once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from schemas.cluster import MAX_CLUSTER_GPUS, MAX_NODES, ClusterSpec
from traces import TraceError, load_cluster
from traces.bundled import resolve_cluster, resolve_trace

HEADER = "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n"


def _csv(tmp_path: Path, switches: int, per_switch: int, gpus: int) -> str:
    path = tmp_path / "spec.csv"
    path.write_text(f"{HEADER}{switches},{per_switch},{gpus},8,64\n")
    return str(path)


def _json(tmp_path: Path, nodes: list[dict[str, Any]] | str) -> str:
    path = tmp_path / "spec.json"
    path.write_text(nodes if isinstance(nodes, str) else json.dumps({"nodes": nodes}))
    return str(path)


def _nodes(count: int, gpus: int) -> list[dict[str, Any]]:
    return [{"node_id": f"n{i}", "switch_id": "s0", "gpus": gpus} for i in range(count)]


# (how the cluster is written, gpus per server, the message's key words)
OVER = [
    pytest.param(lambda _: "400000000", "4", "100,000,000 nodes", id="gpu-count-huge"),
    pytest.param(lambda _: str(4 * (MAX_NODES + 1)), "4", "65,537 nodes", id="gpu-count-1-over"),
    pytest.param(lambda _: f"{MAX_CLUSTER_GPUS + 64}", "64", "GPUs is more than",
                 id="gpu-count-gpus"),
    pytest.param(lambda _: "128", "128", "128 GPUs per server", id="gpu-count-wide-servers"),
    pytest.param(lambda p: _csv(p, 1, MAX_NODES + 1, 1), "4", "65,537 nodes", id="csv-nodes"),
    pytest.param(lambda p: _csv(p, 1_000_000, 1_000, 8), "4", "nodes is more than",
                 id="csv-huge"),
    pytest.param(lambda p: _csv(p, 1, 8193, 64), "4", "GPUs is more than", id="csv-gpus"),
    pytest.param(lambda p: _json(p, _nodes(8193, 64)), "4", "GPUs is more than",
                 id="json-gpus"),
]


@pytest.mark.parametrize(("spec", "per_server", "message"), OVER)
def test_every_syntax_refuses_a_cluster_over_the_limits_at_once(
        tmp_path: Path, spec: Any, per_server: str, message: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as exc:
        load_cluster(spec(tmp_path), per_server)
    assert message in str(exc.value)
    assert "at most 65,536 nodes, 64 GPUs per node and 524,288 GPUs in all" in str(exc.value)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize(("spec", "per_server", "nodes"), [
    pytest.param(lambda _: str(8 * 1024), "8", 1024, id="gpu-count"),
    pytest.param(lambda p: _csv(p, 4, 256, 8), "4", 1024, id="csv"),
    pytest.param(lambda p: _json(p, _nodes(1024, 8)), "4", 1024, id="json"),
])
def test_the_same_size_is_accepted_in_every_syntax(
        tmp_path: Path, spec: Any, per_server: str, nodes: int) -> None:
    cluster = load_cluster(spec(tmp_path), per_server)
    assert len(cluster.nodes) == nodes and cluster.total_gpus == 8 * nodes


def test_the_cluster_model_itself_enforces_the_limits() -> None:
    with pytest.raises(ValueError, match="GPUs is more than"):
        ClusterSpec.uniform(1, 8193, 64)


@pytest.mark.parametrize(("text", "message"), [
    ('{"nodes": [{"node_id": "n0", "switch_id": "s0", "gpus": "8"}]}',
     'got "8"; allowed: a whole number'),
    ('{"nodes": [{"node_id": "n0", "switch_id": "s0", "gpus": true}]}',
     "got true; allowed: a whole number"),
    ('{"nodes": [{"node_id": "n0", "switch_id": "s0", "gpus": 8, "gpus": 1}]}',
     "key 'gpus' appears twice"),
    ('{"name": "a", "name": "b", "nodes": []}', "key 'name' appears twice"),
])
def test_a_json_cluster_is_read_as_typed_with_each_key_once(
        tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError) as exc:
        load_cluster(_json(tmp_path, text))
    assert message in str(exc.value)


@pytest.mark.parametrize("kind", ["trace", "cluster"])
def test_a_directory_is_called_a_directory(tmp_path: Path, kind: str) -> None:
    (tmp_path / "a.csv").write_text(HEADER)
    resolve = resolve_trace if kind == "trace" else resolve_cluster
    with pytest.raises(TraceError) as exc:
        resolve(str(tmp_path))
    assert f"is a directory, not a {kind} file" in str(exc.value)
    assert "a.csv" in str(exc.value) and "no bundled" not in str(exc.value)
