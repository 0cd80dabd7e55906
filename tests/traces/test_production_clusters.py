"""Production clusters: bundled at their papers' sizes, or read from a downloaded machine
table; and tenants files generated from the traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.tenants import load_tenants
from tests.traces.production_builders import (
    attempt,
    philly_job,
    write_gpu_numbers,
    write_helios,
    write_machine_list,
    write_pai_machines,
    write_philly_log,
)
from traces import PRODUCTION_CLUSTERS, PRODUCTION_TRACES, TraceError, load_cluster
from traces.production import NODES_PER_SWITCH
from traces.tenants import generate, to_toml

SIZES: list[tuple[str, int, dict[int, int], str]] = [
    # name, GPUs, {GPUs per node: nodes}, GPU type
    ("philly", 2490, {2: 321, 8: 231}, "gpu"),
    ("helios/earth", 1152, {8: 144}, "gpu"),
    ("helios/saturn", 2096, {8: 262}, "gpu"),
    ("helios/uranus", 1056, {8: 132}, "gpu"),
    ("helios/venus", 1064, {8: 133}, "gpu"),
    ("acme/seren", 2288, {8: 286}, "a100"),
    ("acme/kalos", 2416, {8: 302}, "a100"),
]


@pytest.mark.parametrize(("name", "gpus", "nodes", "gpu_type"), SIZES, ids=[s[0] for s in SIZES])
def test_bundled_production_clusters_have_the_papers_sizes(
        name: str, gpus: int, nodes: dict[int, int], gpu_type: str) -> None:
    spec = load_cluster(name)
    assert spec.total_gpus == gpus and spec.name == name.rsplit("/", 1)[-1]
    sizes: dict[int, int] = {}
    for n in spec.nodes:
        sizes[n.gpus] = sizes.get(n.gpus, 0) + 1
    assert sizes == nodes and spec.gpus_by_type == {gpu_type: gpus}
    per_switch: dict[str, set[int]] = {}
    for n in spec.nodes:
        per_switch.setdefault(n.switch_id, set()).add(n.gpus)
    assert all(len(kinds) == 1 for kinds in per_switch.values())  # a rack holds one kind
    assert max(sum(1 for n in spec.nodes if n.switch_id == s) for s in per_switch) == \
        NODES_PER_SWITCH


def test_every_production_cluster_and_trace_names_its_source() -> None:
    assert [c.name for c in PRODUCTION_CLUSTERS] == [s[0] for s in SIZES]
    assert all(c.source and c.gpus == load_cluster(c.name).total_gpus
               for c in PRODUCTION_CLUSTERS)
    assert [t.format for t in PRODUCTION_TRACES] == ["philly-log", "helios", "acme",
                                                      "alibaba-pai"]
    root = Path(__file__).resolve().parents[2]
    for t in PRODUCTION_TRACES:
        assert t.licence == "CC-BY-4.0" and t.source.startswith("https://github.com/")
        assert (root / t.docs).is_file(), t.docs


def test_philly_machine_list_is_the_cluster_it_lists(tmp_path: Path) -> None:
    machines = [(f"m{i}", "8" if i % 3 == 0 else "2", "24GB" if i % 3 == 0 else "12")
                for i in range(70)]
    spec = load_cluster(str(write_machine_list(tmp_path, machines)))
    assert spec.name == "cluster_machine_list"
    assert spec.total_gpus == 24 * 8 + 46 * 2
    assert [n.node_id for n in spec.nodes[:3]] == ["m0", "m3", "m6"]  # 8-GPU rack first
    assert len(spec.switches) == 1 + 2  # 24 eight-GPU machines; 46 two-GPU: 32 + 14


def test_pai_machine_spec_is_a_heterogeneous_cluster(tmp_path: Path) -> None:
    path = write_pai_machines(tmp_path, [
        {}, {"gpu_type": "T4", "cap_gpu": "2", "cap_cpu": "64"}, {},
        {"gpu_type": "CPU", "cap_gpu": "0"},  # no GPUs: left out
        {"gpu_type": "MISC", "cap_gpu": "8.0"},
    ])
    spec = load_cluster(str(path))
    assert spec.gpus_by_type == {"V100": 16, "T4": 2, "MISC": 8}
    assert len(spec.nodes) == 4 and {n.cpus for n in spec.nodes} == {96, 64}
    assert spec.node("m0").mem_gb == 512.0
    header = write_pai_machines(tmp_path, [{}], header=True)
    assert load_cluster(str(header)).total_gpus == 8


def test_machine_table_with_no_gpus(tmp_path: Path) -> None:
    path = write_pai_machines(tmp_path, [{"gpu_type": "CPU", "cap_gpu": "0"}])
    with pytest.raises(TraceError, match="lists no machine with GPUs"):
        load_cluster(str(path))


def test_tenants_from_helios_gpu_numbers(tmp_path: Path) -> None:
    path = write_gpu_numbers(tmp_path, [("2020-04-01", {"vc1": "64", "vc2": "32"}),
                                        ("2020-09-27", {"vc1": "96", "vc3": "0"})],
                             vcs=["vc1", "vc2", "vc3"])
    last = generate(path)
    assert {t: (v.weight, v.max_gpus) for t, v in last.config.tenants.items()} == {
        "vc1": (96.0, 96)}
    assert last.left_out == ("vc3",) and "2020-09-27" in last.source
    first = generate(path, date="2020-04-01")
    assert {t: v.max_gpus for t, v in first.config.tenants.items()} == {"vc1": 64, "vc2": 32}
    out = tmp_path / "tenants.toml"
    out.write_text(to_toml(first.config, first.source))
    assert load_tenants(out) == first.config
    with pytest.raises(TraceError, match="no row for '2021-01-01'"):
        generate(path, date="2021-01-01")


def test_tenants_from_a_trace_weigh_gpu_time(tmp_path: Path) -> None:
    jobs = [philly_job(0, vc="a"), philly_job(1, vc="b", attempts=[  # 3 x the GPU time
        attempt("2017-10-03 06:39:26", "2017-10-03 07:39:26", gpus=6)]),
        philly_job(2, vc="c", attempts=[])]  # never ran: no tenant
    made = generate(write_philly_log(tmp_path, jobs))
    assert {t: v.weight for t, v in made.config.tenants.items()} == {"a": 25.0, "b": 75.0}
    assert all(v.max_gpus is None for v in made.config.tenants.values())
    json_out = tmp_path / "t.json"
    json_out.write_text(json.dumps(made.config.model_dump(exclude_none=True)))
    assert load_tenants(json_out) == made.config
    filtered = generate(write_helios(tmp_path, [{"vc": "x"}, {"vc": "y"}]),
                        trace_filter="vc=y")
    assert list(filtered.config.tenants) == ["y"]


def test_tenant_options_that_do_not_apply(tmp_path: Path) -> None:
    numbers = write_gpu_numbers(tmp_path, [("d", {"v": "8"})], vcs=["v"])
    with pytest.raises(ValueError, match="--trace-filter applies to traces"):
        generate(numbers, trace_filter="gpus>=2")
    with pytest.raises(ValueError, match="--date applies to"):
        generate("tiresias/60_job", date="2020-01-01")
