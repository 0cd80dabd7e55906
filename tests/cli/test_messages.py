"""What the CLI says when input is wrong: Loom's words (the flag or field, the value, what is
allowed), never pydantic's text or a pydantic.dev link; a directory is called a directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.cli import main

NOWHERE = "nats://127.0.0.1:1"  # refused before anything connects


@pytest.mark.parametrize(("flags", "message"), [
    (["--gpus", "0"], "--gpus: got 0; allowed: a number of at least 1"),
    (["--gpus", "5000"], "--gpus: got 5000; allowed: a number of at most 4096"),
    (["--iterations", "0"], "--iterations: got 0; allowed: a number of at least 1"),
    (["--tenant", "a b"], '--tenant: got "a b"; allowed: letters, digits and _ . : - /'),
    (["--job-id", "../etc"], '--job-id: got "../etc"; allowed: a letter or digit, then'),
])
def test_submit_refusals_name_the_flag_the_value_and_what_is_allowed(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--model": "resnet18", "--gpus": "1", "--iterations": "10"}
    base.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    argv = ["submit", "--nats-url", NOWHERE, *[x for kv in base.items() for x in kv]]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: loom submit: {message}" in err
    assert "pydantic" not in err and "Input should" not in err


@pytest.mark.parametrize(("argv", "message"), [
    (["sim", "--trace", "{dir}", "--cluster", "n8g8", "--policy", "srtf"],
     "is a directory, not a trace file"),
    (["sim", "--trace", "tiresias/60_job", "--cluster", "{dir}", "--policy", "srtf"],
     "is a directory, not a cluster file"),
    (["replay", "{dir}"], "is a directory, not an event log file"),
])
def test_a_directory_given_for_a_file_is_called_a_directory(
        argv: list[str], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([a.replace("{dir}", str(tmp_path)) for a in argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{tmp_path}: {message}" in err
    assert "no such file" not in err and "no bundled" not in err


def test_sim_help_states_the_cluster_limits(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "at most 65,536 nodes, 64 GPUs per node and 524,288 GPUs in all" in text


def test_an_oversized_gpu_count_cluster_exits_2_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--trace", "tiresias/60_job", "--cluster", "400000000",
                 "--policy", "srtf"]) == 2
    assert "100,000,000 nodes is more than the 65,536" in " ".join(
        capsys.readouterr().err.split())
