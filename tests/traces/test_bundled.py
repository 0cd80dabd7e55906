"""The bundled traces: every one loads, with the job count of the published file."""

from __future__ import annotations

import glob
import tomllib
from pathlib import Path

import pytest

from traces import bundled_traces, load_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
SHARED = Path("/work/shared/data")

EXPECTED_JOBS = {
    "muri/trace1": 1494,
    "muri/trace2": 5755,
    "muri/trace3": 992,
    "muri/trace4": 2638,
    "muri/trace1_pr": 1494,
    "muri/trace2_pr": 5755,
    "muri/trace3_pr": 992,
    "muri/trace4_pr": 2638,
    "muri/testbed": 400,
    "tiresias/60_job": 60,
    "elasticflow/elasticVpollux_e": 195,
    "elasticflow/philly_103959": 876,
    "elasticflow/resnet_cifar": 5,
    "itp/195job": 195,
    **{f"itp/cluster{i:02d}": n for i, n in enumerate(
        (1595, 5778, 3011, 15802, 3629, 2396, 12699, 13047, 11134, 260), start=1)},
    **{f"pollux/workload-{i}": 160 for i in range(1, 9)},
}


def test_bundled_names_are_exactly_the_expected_set() -> None:
    # Gavel's names are checked, file by file, in test_gavel_reader.py
    names = [t.name for t in bundled_traces() if not t.name.startswith("gavel/")]
    assert sorted(names) == sorted(EXPECTED_JOBS)


@pytest.mark.parametrize(("name", "count"), EXPECTED_JOBS.items())
def test_bundled_trace_loads_with_expected_job_count(name: str, count: int) -> None:
    [info] = [t for t in bundled_traces() if t.name == name]
    trace = load_trace(name)
    assert trace.name == name
    assert trace.path == info.path
    assert trace.format == info.format  # the registry agrees with header detection
    assert len(trace.jobs) == count
    assert len({j.job_id for j in trace.jobs}) == count
    submits = [j.submit_time_s for j in trace.jobs]
    assert submits == sorted(submits)


def test_static_arrival_variants_keep_file_order() -> None:
    jobs = load_trace("muri/trace3_pr").jobs
    assert {j.submit_time_s for j in jobs} == {0.0}
    assert [j.job_id for j in jobs] == [str(i) for i in range(992)]


def test_unsorted_upstream_file_is_sorted() -> None:
    # resnet_cifar_trace.csv lists job 3 (t=309537) before job 4 (t=5602).
    jobs = load_trace("elasticflow/resnet_cifar").jobs
    assert [j.job_id for j in jobs] == ["0", "1", "2", "4", "3"]


def test_muri_spot_values_match_the_file() -> None:
    # trace1.csv line 3: 1,8,201694000,8787693,dqn,128,4472936000,201694000,509,435,8,0.5,0
    job = next(j for j in load_trace("muri/trace1").jobs if j.job_id == "1")
    assert (job.gpus, job.iterations, job.model, job.batch_size, job.priority) == (
        8, 8787693, "dqn", 128, 0,
    )  # fmt: skip
    assert job.submit_time_s == 201694.0
    assert job.iteration_time_s == pytest.approx(0.509)
    assert job.stage_times_s == pytest.approx((0.435, 0.008, 0.0005))


def test_philly_103959_uses_iteration_and_duration_columns() -> None:
    # line 3: 1,219316,26446831,vgg16,2065619,64,4,1792395,1792395,26446831
    job = next(j for j in load_trace("elasticflow/philly_103959").jobs if j.job_id == "1")
    assert (job.iterations, job.duration_s, job.deadline_s, job.gpus) == (
        26446831, 1792395.0, 2065619.0, 4,
    )  # fmt: skip


def test_itp_195job_keeps_uuid_ids_and_deadlines() -> None:
    first = load_trace("itp/195job").jobs[0]
    assert first.job_id == "bdd640fb-0667-1ad1-1c80-317fa3b1799d"
    assert (first.submit_time_s, first.deadline_s, first.iterations) == (3715485.0, 3716178.0, 3249)


@pytest.mark.parametrize(
    ("origin", "licence", "spelled"),
    [
        ("muri", "Apache License", "Apache License 2.0"),
        ("tiresias", "Apache License", "Apache License 2.0"),
        ("elasticflow", "Apache License", "Apache License 2.0"),
        ("itp", "MIT License", "MIT"),
        ("pollux", "Apache License", "Apache License 2.0"),
    ],
)
def test_each_origin_ships_its_licence_and_is_attributed(
    origin: str, licence: str, spelled: str
) -> None:
    assert licence in (DATA / origin / "LICENSE").read_text()
    attribution = (DATA / "ATTRIBUTION.md").read_text()
    section = attribution.split(f"## `{origin}/`", 1)[1].split("\n## ", 1)[0]
    assert f"Licence: {spelled}" in section
    assert "commit `" in section


def test_every_bundled_file_is_in_a_licensed_origin_folder() -> None:
    for path in DATA.rglob("*"):
        if path.is_file() and path.name != "ATTRIBUTION.md":
            origin = path.relative_to(DATA).parts[0]
            assert (DATA / origin / "LICENSE").is_file(), path


def _shared_copy(path: Path) -> Path:
    rel = path.relative_to(DATA)
    if rel.parts[0] == "itp":  # the ITP traces sit under elasticflow/ in the shared folder
        return SHARED / "elasticflow" / "itp-traces" / Path(*rel.parts[1:])
    return SHARED / rel


@pytest.mark.skipif(not SHARED.is_dir(), reason="reference data folder not present")
def test_bundled_files_are_byte_identical_to_the_reference_copies() -> None:
    files = [p for p in DATA.rglob("*") if p.is_file() and p.name != "ATTRIBUTION.md"]
    # 5 licences + 15 traces + 26 cluster specs + 3 size distributions + ElasticFlow's 13
    # scaling tables, and Gavel's 2 throughput tables, 15 msr + 8 physical-cluster traces and
    # 2 cluster-spec JSONs (89); ITP clusters 1-9 (9); Pollux's licence, 8 workloads and, for
    # 6 applications, placements, scalability and 40 validation runs in all (61)
    assert len(files) == 159
    for path in files:
        assert path.read_bytes() == _shared_copy(path).read_bytes(), path


def test_package_data_globs_cover_every_bundled_file() -> None:
    # Mirrors setuptools: package-data patterns are recursive globs relative to the package.
    pyproject = tomllib.loads((DATA.parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["traces"]
    package = DATA.parent
    covered = {
        Path(p) for pattern in patterns for p in glob.glob(str(package / pattern), recursive=True)
    }
    files = {p for p in DATA.rglob("*") if p.is_file()}
    assert files <= covered
