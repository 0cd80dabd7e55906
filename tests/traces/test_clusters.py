"""Cluster specs: bundled names, plain-name resolution order and the CSV reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.traces.builders import csv_text
from traces import TraceError, bundled_clusters, load_cluster

# name -> (switches, nodes, GPUs per node, CPUs per node, GB per node, spec name)
CLUSTERS: dict[str, tuple[int, int, int, int, float, str]] = {
    "n8g8": (1, 8, 8, 92, 520.0, "n8g8"),  # Muri simulator wins over the others
    "muri/n8g8": (1, 8, 8, 92, 520.0, "n8g8"),
    "elasticflow/n8g8": (1, 8, 8, 40, 256.0, "n8g8"),
    "muri/testbed/n8g8": (1, 8, 8, 92, 350.0, "n8g8"),
    "n16g4": (1, 16, 4, 64, 256.0, "n16g4"),  # only ElasticFlow has it
    "cluster_spec": (1, 16, 4, 128, 254.0, "cluster_spec"),  # Tiresias default
    "n32g4": (1, 32, 4, 40, 256.0, "n32g4"),  # Tiresias before ElasticFlow (same values)
    "n160g8": (5, 160, 8, 128, 256.0, "n160g8"),
    "tiresias/n256g8": (8, 256, 8, 64, 256.0, "n256g8"),
    "n1g8": (1, 1, 8, 40, 256.0, "n1g8"),  # ElasticFlow before the Muri testbed
    "muri/testbed/n1g8": (1, 1, 8, 92, 350.0, "n1g8"),
    "n2g8": (1, 2, 8, 92, 350.0, "n2g8"),  # only the Muri testbed has it
    "muri/testbed/n4g8": (1, 2, 8, 92, 350.0, "n4g8"),  # upstream file really has 2 nodes
    "n4g8": (1, 4, 8, 40, 256.0, "n4g8"),
    "n1g2": (1, 2, 1, 40, 256.0, "n1g2"),  # upstream: 2 nodes x 1 GPU
}


@pytest.mark.parametrize("name", CLUSTERS)
def test_bundled_cluster(name: str) -> None:
    switches, nodes, gpus, cpus, mem, spec_name = CLUSTERS[name]
    spec = load_cluster(name)
    assert spec.name == spec_name
    assert len(spec.switches) == switches
    assert len(spec.nodes) == nodes
    assert spec.total_gpus == nodes * gpus
    assert {(n.gpus, n.cpus, n.mem_gb) for n in spec.nodes} == {(gpus, cpus, mem)}


def test_n8g8_and_n16g4_both_have_64_gpus() -> None:
    assert load_cluster("n8g8").total_gpus == 64
    assert load_cluster("n16g4").total_gpus == 64


def test_every_listed_cluster_loads_and_names_are_namespaced() -> None:
    names = bundled_clusters()
    assert len(names) == 26  # 1 Muri simulator + 5 Tiresias + 16 ElasticFlow + 4 Muri testbed
    assert names[0] == "muri/n8g8"
    assert names[-4:] == [f"muri/testbed/n{n}g8" for n in (1, 2, 4, 8)]
    for name in names:
        assert "/" in name
        spec = load_cluster(name)
        assert spec.name == name.rsplit("/", 1)[1]
        assert spec.total_gpus >= 1


def test_trace_files_are_not_listed_as_clusters() -> None:
    assert "tiresias/60_job" not in bundled_clusters()
    with pytest.raises(TraceError, match="no bundled cluster"):
        load_cluster("60_job")


def _spec(tmp_path: Path, text: str, name: str = "mine.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cluster_from_path_is_named_after_the_file(tmp_path: Path) -> None:
    text = csv_text(
        "cluster", [{"num_switch": "2", "num_node_p_switch": "3", "mem_p_node": "64.5"}]
    )
    spec = load_cluster(_spec(tmp_path, text, "lab.csv"))
    assert spec.name == "lab"
    assert spec.switches == ("s0", "s1")
    assert [n.node_id for n in spec.nodes] == [f"n{i}" for i in range(6)]
    assert spec.total_gpus == 48
    assert spec.nodes[0].mem_gb == 64.5


def test_cluster_path_given_as_string(tmp_path: Path) -> None:
    path = _spec(tmp_path, csv_text("cluster", [{}]))
    assert load_cluster(str(path)).total_gpus == 64


@pytest.mark.parametrize(
    ("rows", "line", "field", "fragment"),
    [
        ([], 1, None, "expected exactly one data row, got 0"),
        ([{}, {}], 3, None, "expected exactly one data row, got 2"),
        ([{"num_gpu_p_node": "0"}], 2, "num_gpu_p_node", "expected a positive integer"),
        ([{"num_switch": "x"}], 2, "num_switch", "expected a positive integer, got 'x'"),
        ([{"num_cpu_p_node": "-1"}], 2, "num_cpu_p_node", "non-negative integer"),
        ([{"mem_p_node": "-5"}], 2, "mem_p_node", "non-negative number"),
        ([{"num_gpu_p_node": "65"}], 2, "num_gpu_p_node", "less than or equal to 64"),
        ([{"num_switch": "1000", "num_node_p_switch": "1000"}], 2, "num_node_p_switch", "nodes"),
    ],
)
def test_bad_cluster_spec(
    tmp_path: Path, rows: list[dict[str, str]], line: int, field: str | None, fragment: str
) -> None:
    path = _spec(tmp_path, csv_text("cluster", rows))
    with pytest.raises(TraceError) as info:
        load_cluster(path)
    assert (info.value.line, info.value.field) == (line, field)
    assert fragment in info.value.message
    assert str(info.value).startswith(f"mine.csv line {line}")


def test_cluster_header_must_be_the_five_columns(tmp_path: Path) -> None:
    path = _spec(tmp_path, "num_switch,num_node_p_switch,num_gpu_p_node\n1,8,8\n")
    with pytest.raises(TraceError, match="expected cluster-spec columns") as info:
        load_cluster(path)
    assert info.value.line == 1


def test_unknown_cluster_name_suggests_close_ones() -> None:
    with pytest.raises(TraceError) as info:
        load_cluster("n9g8")
    assert "close matches: muri/n8g8, elasticflow/n8g8" in str(info.value)
