"""`loom submit` through the real entry point (`loom.cli.main`) to a real nats-server: what
lands on `loom.jobs.submit` is what the command line said.

`main` once stored its own argv on the same attribute as `--command`, so every command job
ran `submit --model ...`; parsing alone (without `main`) could not see it.

A job for Loom's trainer names a model the trainer runs, or is refused before anything is
sent (exit 2); a command job's model is only a label.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
import pytest

from domain.workloads import FAMILIES
from loom.cli import main
from loom.live_cli import TRACE_MODEL_EXAMPLES, check_model
from schemas import subjects
from services.runtime.nats_live import ensure_stream

pytestmark = pytest.mark.nats


async def create_stream(url: str) -> None:
    """What the cluster's services do when they start: `loom submit` creates nothing."""
    nc = await nats.connect(url)
    try:
        await ensure_stream(nc.jetstream())
    finally:
        await nc.close()


async def stored_submissions(url: str) -> list[dict[str, Any]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.STREAM)
        if not info.state.messages:
            return []  # an empty stream has no sequence to read from
        bodies = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(subjects.STREAM, seq)
            if msg.subject == subjects.JOB_SUBMIT:
                bodies.append(json.loads(msg.data))
        return bodies
    finally:
        await nc.close()


@pytest.mark.parametrize(("model", "extra", "command"), [
    ("cnn", [], None),  # a workload family
    ("resnet18", [], None),  # a trace model name, run as its family (cnn)
    ("mnist-like", ["--command", "python", "examples/train_mnist_like.py"],
     ["python", "examples/train_mnist_like.py"]),
    ("mnist-like",
     ["--env", "A=1", "--command", "torchrun", "--nproc-per-node", "1", "t.py", "--lr", "0.1"],
     ["torchrun", "--nproc-per-node", "1", "t.py", "--lr", "0.1"]),
])
async def test_submit_sends_the_job_the_command_line_describes(
        nats_server: Any, model: str, extra: list[str], command: list[str] | None,
        capsys: pytest.CaptureFixture[str]) -> None:
    await create_stream(nats_server.url)
    argv = ["submit", "--nats-url", nats_server.url, "--model", model, "--gpus", "2",
            "--iterations", "300", "--job-id", "j1", *extra]
    assert await asyncio.to_thread(main, argv) == 0
    assert capsys.readouterr().out.strip() == "j1"
    (body,) = await stored_submissions(nats_server.url)
    assert (body["job_id"], body["model"], body["gpus"], body["iterations"]) == \
        ("j1", model, 2, 300)
    assert body.get("command") == command


KNOWN = "cnn, lstm, rl, transformer"  # the trainer's families, sorted


@pytest.mark.parametrize("model", [
    "foo",
    "mnist-like",  # fine as a command job's label; Loom's trainer has no such workload
    "recommendation",  # a Gavel trace model, but of no family the trainer runs
    "CNN",  # families are named exactly (as the node agent looks them up)
    "",
])
async def test_an_unknown_model_is_refused_before_anything_is_sent(
        nats_server: Any, model: str, capsys: pytest.CaptureFixture[str]) -> None:
    nc = await nats.connect(nats_server.url)
    try:  # the stream exists, so a submit that got through would be stored
        await ensure_stream(nc.jetstream())
    finally:
        await nc.close()
    argv = ["submit", "--nats-url", nats_server.url, "--model", model, "--gpus", "1",
            "--iterations", "10", "--job-id", "j1"]
    assert await asyncio.to_thread(main, argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: loom submit: unknown model {model!r}; known models: "
                          f"{KNOWN} (or a trace model name of these families, such as "), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert await stored_submissions(nats_server.url) == []


def test_the_known_models_are_the_trainers_and_the_message_names_only_accepted_ones() -> None:
    assert ", ".join(sorted(FAMILIES)) == KNOWN
    for model in [*FAMILIES, *TRACE_MODEL_EXAMPLES]:
        check_model(model)  # raises if refused


@pytest.mark.parametrize("model", ["foo", "mnist-like"])
def test_an_unknown_model_needs_no_server(model: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Refused (2), not "no server" (3), with nothing listening: the check is local."""
    argv = ["submit", "--nats-url", "nats://127.0.0.1:1", "--model", model, "--gpus", "1",
            "--iterations", "10"]
    assert main(argv) == 2
    assert f"unknown model {model!r}" in capsys.readouterr().err


async def test_submit_to_a_server_without_the_stream_says_the_cluster_is_not_up(
        nats_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`loom submit` needs no JetStream rights (people have none): it creates no stream, and
    a submission nothing would store is refused, not lost."""
    argv = ["submit", "--nats-url", nats_server.url, "--model", "cnn", "--gpus", "1",
            "--iterations", "5", "--job-id", "early"]
    assert await asyncio.to_thread(main, argv) == 3
    err = capsys.readouterr().err
    assert f"no stream at {nats_server.url} stores {subjects.JOB_SUBMIT}" in err, err
