"""`loom models`: the families the trainer runs, the model names that run as each, and the
bundled throughput profiles; what it lists, `loom submit` accepts."""

from __future__ import annotations

import json

import pytest

from domain.workloads import FAMILIES, for_trace_model
from loom.cli import main
from loom.live_cli import check_model
from loom.models_cli import models


def test_lists_every_family_and_the_names_that_run_as_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    printed = capsys.readouterr().out
    for family in FAMILIES:
        assert family in printed
    for name in ("resnet*", "bert*", "lstm*", "a2c*", "ResNet-50 (batch size 32)", "v100"):
        assert name in printed


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_what_it_lists_is_what_submit_accepts(family: str) -> None:
    listed = next(f for f in models()["families"] if f["family"] == family)
    check_model(family)
    for pattern in listed["models"]:
        name = pattern.rstrip("*") + "-x"
        check_model(name)
        assert for_trace_model(name) == family


@pytest.mark.parametrize(("gpus", "job_type", "v100"), [
    (1, "ResNet-50 (batch size 32)", 7.79),
    (2, "ResNet-50 (batch size 32)", None),
])
def test_profiles_at_a_gpu_count(gpus: int, job_type: str, v100: float | None,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json", "--gpus", str(gpus)]) == 0
    data = json.loads(capsys.readouterr().out)
    row = next(p for p in data["profiles"] if p["job_type"] == job_type)
    assert row["family"] == "cnn" and row["gpus"] == gpus
    if v100 is not None:
        assert row["iterations_per_s"]["v100"] == pytest.approx(v100, abs=0.01)
    assert set(row["iterations_per_s"]) == {"k80", "p100", "v100"}
