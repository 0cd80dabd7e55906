"""The traces and cluster specs shipped in `traces/data/`, and name resolution for both."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from traces.errors import TraceError

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class BundledTrace:
    name: str
    format: str
    path: Path
    description: str


def _trace(name: str, fmt: str, relpath: str, description: str) -> BundledTrace:
    return BundledTrace(name, fmt, DATA_DIR / relpath, description)


_MURI = "muri/simulator/trace-data"
_GAVEL = "gavel/traces"
# Gavel's traces by name, with their job counts (for the descriptions).
_GAVEL_MSR = {
    "0e4a51": 1181, "103959": 986, "11cb48": 2000, "23dbec": 9, "2869ce": 533, "51b7ef": 18,
    "6214e9": 2000, "6c71a0": 2000, "795a4c": 3, "7f04ca": 972, "925e2b": 4, "b436b2": 2000,
    "e13805": 607, "ed69ec": 951, "ee9e8c": 2000,
}  # fmt: skip
_GAVEL_PHYSICAL = {
    "artifact_evaluation": 15, "debug": 14, "debug_v2": 14, "highmem_test": 8,
    "max_min_fairness": 96, "medium_test": 20, "minimize_makespan": 100, "small_test": 20,
}  # fmt: skip
# The ten ITP clusters (jobs, the cluster spec ElasticFlow's run_fig8b.sh simulates each on).
_ITP_CLUSTERS = (
    (1595, "n64g8"), (5778, "n64g8"), (3011, "n64g8"), (15802, "n128g8"), (3629, "n64g8"),
    (2396, "n64g8"), (12699, "n128g8"), (13047, "n128g8"), (11134, "n128g8"), (260, "n32g8"),
)  # fmt: skip
_TRACES: tuple[BundledTrace, ...] = (
    *(
        _trace(f"muri/trace{i}", "muri", f"{_MURI}/trace{i}.csv", f"Muri simulator trace {i}")
        for i in range(1, 5)
    ),
    *(
        _trace(
            f"muri/trace{i}_pr",
            "muri",
            f"{_MURI}/trace{i}_pr.csv",
            f"Muri trace {i} with every job submitted at time 0",
        )
        for i in range(1, 5)
    ),
    _trace(
        "muri/testbed",
        "muri",
        "muri/cluster_exp/trace-data/cluster_trace.csv",
        "Muri 400-job testbed trace (8 x 8 V100)",
    ),
    _trace("tiresias/60_job", "tiresias", "tiresias/60_job.csv", "Tiresias 60-job example"),
    _trace(
        "elasticflow/elasticVpollux_e",
        "elasticflow",
        "elasticflow/traces_for_ElasticFlow/elasticVpollux_e.csv",
        "ElasticFlow vs Pollux, 195 jobs on Pollux/T4 models (paper Fig. 8a)",
    ),
    _trace(
        "elasticflow/philly_103959",
        "elasticflow",
        "elasticflow/traces_for_ElasticFlow/philly_103959.csv",
        "ElasticFlow trace of Philly virtual cluster 103959",
    ),
    _trace(
        "elasticflow/resnet_cifar",
        "elasticflow",
        "elasticflow/traces_for_ElasticFlow/resnet_cifar_trace.csv",
        "ElasticFlow 5-job ResNet50/CIFAR-10 trace",
    ),
    _trace(
        "itp/195job",
        "itp",
        "itp/elasticflow-traces/195job.csv",
        "Microsoft ITP 195-job testbed trace used by ElasticFlow",
    ),
    *(
        _trace(
            f"itp/cluster{i:02d}",
            "itp",
            f"itp/elasticflow-traces/cluster{i:02d}.csv",
            f"Microsoft ITP cluster {i} with ElasticFlow deadlines ({jobs:,} jobs; "
            f"ElasticFlow's Fig. 8b runs it on {cluster})",
        )
        for i, (jobs, cluster) in enumerate(_ITP_CLUSTERS, start=1)
    ),
    *(
        _trace(
            f"pollux/workload-{i}",
            "pollux",
            f"pollux/workloads/workload-{i}.csv",
            f"Pollux workload {i}: 160 jobs over 8 hours (paper Fig. 7/8, 16 x 4 GPUs)",
        )
        for i in range(1, 9)
    ),
    *(
        _trace(
            f"gavel/msr/{vc}",
            "gavel-msr",
            f"{_GAVEL}/msr/seed=0/{vc}.trace",
            f"Gavel's Philly virtual cluster {vc} ({jobs} jobs, seed 0, legacy 7 fields)",
        )
        for vc, jobs in _GAVEL_MSR.items()
    ),
    *(
        _trace(
            f"gavel/physical/{name}",
            "gavel",
            f"{_GAVEL}/physical_cluster/{name}.trace",
            f"Gavel physical-cluster trace {name} ({jobs} jobs)",
        )
        for name, jobs in _GAVEL_PHYSICAL.items()
    ),
)
_TRACES_BY_NAME = {t.name: t for t in _TRACES}

# Cluster-spec origins in the order plain names (e.g. "n8g8") are resolved; the prefix is the
# namespace that picks one origin explicitly. None = every CSV in the folder.
_CLUSTER_ORIGINS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("muri", "muri/simulator/cluster_spec", None),
    ("tiresias", "tiresias", ("cluster_spec", "n1g4", "n32g4", "n160g8", "n256g8")),
    ("elasticflow", "elasticflow/cluster_specs", None),
    ("muri/testbed", "muri/cluster_exp/cluster_specs", None),
)


def _natural(text: str) -> list[int | str]:
    """Sort key putting n2g8 before n16g4."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _cluster_table() -> dict[str, Path]:
    table: dict[str, Path] = {}
    for prefix, folder, stems in _CLUSTER_ORIGINS:
        directory = DATA_DIR / folder
        names = stems if stems is not None else tuple(p.stem for p in directory.glob("*.csv"))
        for stem in sorted(names, key=_natural):
            table[f"{prefix}/{stem}"] = directory / f"{stem}.csv"
    return table


_CLUSTERS = _cluster_table()


def bundled_traces() -> list[BundledTrace]:
    """Every bundled trace, in a stable order."""
    return list(_TRACES)


def bundled_clusters() -> list[str]:
    """Namespaced names of every bundled cluster spec, in plain-name resolution order."""
    return list(_CLUSTERS)


def _unknown(kind: str, name: str, available: list[str]) -> TraceError:
    if Path(name).is_dir():
        inside = sorted(p.name for p in Path(name).glob("*.csv"))[:5]
        hint = f" (CSV files in it: {', '.join(inside)})" if inside else ""
        return TraceError(name, None, None,
                          f"is a directory, not a {kind} file: give one file in it{hint}, "
                          f"or a bundled {kind} name (`loom traces` lists them)")
    # Compare the last path component too, so "n9g8" suggests "elasticflow/n8g8".
    by_tail: dict[str, list[str]] = {}
    for n in available:
        by_tail.setdefault(n.rsplit("/", 1)[-1], []).append(n)
    close = difflib.get_close_matches(name, available, n=5, cutoff=0.6)
    for tail in difflib.get_close_matches(name.rsplit("/", 1)[-1], by_tail, n=3, cutoff=0.6):
        close += by_tail[tail]
    hint = f"close matches: {', '.join(dict.fromkeys(close))}; " if close else ""
    return TraceError(
        name,
        None,
        None,
        f"no bundled {kind} or file of that name; {hint}available: {', '.join(available)}",
    )


# The published names of the files that make a folder a production trace (Philly's job log,
# a Helios cluster's log, Alibaba PAI's tables); `traces.readers.locate` reads them.
TRACE_FOLDER_FILES = ("cluster_job_log", "cluster_log.csv", "pai_job_table.csv",
                      "pai_task_table.csv")


def _trace_folder(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in TRACE_FOLDER_FILES)


def resolve_trace(name_or_path: str | Path) -> tuple[str, Path]:
    """(trace name, file) for a bundled name or a path.

    A `Path` is always a file (or a folder holding a production trace's files). A string is a
    bundled name if one matches, else a path; checking names first keeps a bundled name
    meaning the same whatever the working directory.
    """
    if isinstance(name_or_path, str):
        bundled = _TRACES_BY_NAME.get(name_or_path)
        if bundled is not None:
            return bundled.name, bundled.path
        if not (Path(name_or_path).is_file() or _trace_folder(Path(name_or_path))):
            raise _unknown("trace", name_or_path, list(_TRACES_BY_NAME))
    path = Path(name_or_path)
    return path.stem, path


def resolve_cluster(name_or_path: str | Path) -> Path:
    """The spec file for a cluster name or path.

    Namespaced names (`muri/n8g8`, `tiresias/n32g4`, `elasticflow/n8g8`, `muri/testbed/n4g8`)
    pick one origin; a plain name (`n8g8`) takes the first origin that has it, in the order
    Muri simulator, Tiresias, ElasticFlow, Muri testbed. Strings that are not bundled names
    are paths; `Path` objects always are.
    """
    if isinstance(name_or_path, str):
        if name_or_path in _CLUSTERS:
            return _CLUSTERS[name_or_path]
        for prefix, _, _ in _CLUSTER_ORIGINS:
            path = _CLUSTERS.get(f"{prefix}/{name_or_path}")
            if path is not None:
                return path
        if not Path(name_or_path).is_file():
            raise _unknown("cluster", name_or_path, list(_CLUSTERS))
    return Path(name_or_path)
