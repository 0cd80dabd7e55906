"""Pollux workloads and application profiles: what a job becomes, and bad input named by file,
line and field."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from traces import TraceError, bundled_traces, load_trace
from traces.readers import read_table
from traces.readers.pollux import PROFILE_DIR, applications, load_profile, make_reader

HEADER = "name,time,application,num_replicas,batch_size"
ROWS = ["cifar10-0,107,cifar10,6,2048", "ncf-2,135,ncf,1,32768", "bert-3,262,bert,12,384"]


def workload(tmp_path: Path, rows: list[str] | None = None, header: str = HEADER) -> Path:
    path = tmp_path / "workload.csv"
    path.write_text("\n".join([header, *(ROWS if rows is None else rows)]) + "\n")
    return path


def test_a_workload_row_becomes_a_job_with_its_goodput_profile(tmp_path: Path) -> None:
    trace = load_trace(workload(tmp_path))
    assert trace.format == "pollux" and trace.default_overhead == "flat:30"
    cifar, ncf, bert = trace.jobs
    assert (cifar.job_id, cifar.submit_time_s, cifar.model, cifar.gpus, cifar.batch_size) == (
        "cifar10-0", 107.0, "cifar10", 6, 2048)
    assert cifar.goodput == load_profile("cifar10")
    # progress in statistical units: 100 epochs of CIFAR-10 at the initial batch size 128
    assert cifar.iterations == math.ceil(cifar.goodput.epochs[-1]) == 39063
    assert cifar.duration_s == pytest.approx(cifar.iterations * cifar.iteration_time_s)
    assert 500 < (cifar.duration_s or 0) < 2000  # minutes on 6 GPUs
    assert cifar.goodput.adaptive and cifar.max_gpus is None
    # Pollux keeps ncf at its batch size on one GPU
    assert ncf.goodput is not None and not ncf.goodput.adaptive and ncf.max_gpus == 1
    assert bert.goodput is not None and len(bert.goodput.epochs) == 2


def test_application_profiles_follow_pollux_s_settings() -> None:
    assert applications() == ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
    cifar = load_profile("cifar10")
    assert (cifar.init_batch, cifar.max_batch) == (128, 4096)
    assert len(cifar.epochs) == 100 and cifar.batch_sizes == (128, 256, 512, 1024, 2048, 4096)
    assert load_profile("yolov3").max_local_batch == 8  # Pollux's memory limit for YOLOv3
    assert len(load_profile("imagenet").epochs) == 90


@pytest.mark.parametrize("n", range(1, 9))
def test_the_eight_workloads_are_bundled(n: int) -> None:
    names = {t.name for t in bundled_traces()}
    assert f"pollux/workload-{n}" in names
    trace = load_trace(f"pollux/workload-{n}")
    assert len(trace.jobs) == 160 and trace.format == "pollux"
    assert all(j.goodput is not None for j in trace.jobs)


@pytest.mark.parametrize(("row", "field", "message"), [
    ("x,1,resnet,1,32", "application", "unknown application 'resnet'"),
    ("x,1,cifar10,0,128", "num_replicas", "expected a positive integer, got '0'"),
    ("x,1,cifar10,2,-5", "batch_size", "expected a positive integer, got '-5'"),
    ("x,-1,cifar10,2,128", "time", "expected a non-negative number, got '-1'"),
    ("x,soon,cifar10,2,128", "time", "expected a non-negative number, got 'soon'"),
    ("x,1,ncf,4,32768", "num_replicas", "ncf runs on one GPU"),
    ("a b,1,cifar10,2,128", "name", "should match pattern"),
    (",1,cifar10,2,128", "name", "missing value"),
])
def test_bad_cells_name_file_line_and_field(tmp_path: Path, row: str, field: str,
                                            message: str) -> None:
    path = workload(tmp_path, [ROWS[0], ROWS[1], row])
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert err.value.line == 4 and err.value.field == field
    assert message in str(err.value) and "workload.csv line 4" in str(err.value)


def test_a_short_row_names_the_missing_field(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as err:
        load_trace(workload(tmp_path, ["x,1,cifar10,2"]))
    assert (err.value.line, err.value.field) == (2, "batch_size")


def test_an_unknown_header_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unrecognised header"):
        load_trace(workload(tmp_path, header="name,time,application,replicas,batch_size"))


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="duplicate job id 'cifar10-0'"):
        load_trace(workload(tmp_path, [ROWS[0], ROWS[0]]))


# -- profile folders ----------------------------------------------------------------------------

def profile_copy(tmp_path: Path, app: str = "cifar10") -> Path:
    """A copy of one bundled profile folder that a test can break."""
    root = tmp_path / "profiles"
    shutil.copytree(PROFILE_DIR / app, root / app)
    return root


def replace_line(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(("name", "line", "text", "field", "message"), [
    ("placements.csv", 3, "10,45,0.05,0.0005", "placement", "digits 1-9"),
    ("placements.csv", 3, "1,45,0.05,0.06", "sync_time", "must be below step_time"),
    ("placements.csv", 3, "1,45,abc,0.0005", "step_time", "expected a positive number"),
    ("scalability.csv", 2, "7,6,32,0.14,0.09", "num_nodes", "more nodes (7) than replicas"),
    ("validation-256.csv", 3, "100.0,200,0.6,1.0,1.0", "progress", "must increase"),
    ("validation-256.csv", 3, "800.0,600,0.6,-1.0,1.0", "grad_sqr", "non-negative"),
])
def test_bad_profile_cells_name_file_line_and_field(
        tmp_path: Path, name: str, line: int, text: str, field: str, message: str) -> None:
    root = profile_copy(tmp_path)
    replace_line(root / "cifar10" / name, line, text)
    with pytest.raises(TraceError) as err:
        load_profile("cifar10", root)
    assert err.value.path.name == name
    assert (err.value.line, err.value.field) == (line, field)
    assert message in str(err.value)


def test_a_profile_needs_validation_runs(tmp_path: Path) -> None:
    root = profile_copy(tmp_path)
    for path in (root / "cifar10").glob("validation-*.csv"):
        path.unlink()
    with pytest.raises(TraceError, match="no validation"):
        load_profile("cifar10", root)


def test_a_reader_can_take_profiles_from_another_folder(tmp_path: Path) -> None:
    root = profile_copy(tmp_path, "yolov3")
    read = make_reader(root)
    jobs = read(read_table(workload(tmp_path, ["y,5,yolov3,4,64"])))
    assert [(line, j.model) for line, j in jobs] == [(2, "yolov3")]
    with pytest.raises(TraceError, match="profiles exist for yolov3"):
        read(read_table(workload(tmp_path, ["c,5,cifar10,4,128"])))
