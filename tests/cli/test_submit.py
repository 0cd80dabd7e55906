"""`loom submit` through the real entry point (`loom.cli.main`) to a real nats-server: what
lands on `loom.jobs.submit` is what the command line said.

`main` once stored its own argv on the same attribute as `--command`, so every command job
ran `submit --model ...`; parsing alone (without `main`) could not see it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
import pytest

from loom.cli import main
from schemas import subjects

pytestmark = pytest.mark.nats


async def stored_submissions(url: str) -> list[dict[str, Any]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.STREAM)
        bodies = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(subjects.STREAM, seq)
            if msg.subject == subjects.JOB_SUBMIT:
                bodies.append(json.loads(msg.data))
        return bodies
    finally:
        await nc.close()


@pytest.mark.parametrize(("extra", "command"), [
    ([], None),
    (["--command", "python", "examples/train_mnist_like.py"],
     ["python", "examples/train_mnist_like.py"]),
    (["--env", "A=1", "--command", "torchrun", "--nproc-per-node", "1", "t.py", "--lr", "0.1"],
     ["torchrun", "--nproc-per-node", "1", "t.py", "--lr", "0.1"]),
])
async def test_submit_sends_the_job_the_command_line_describes(
        nats_server: Any, extra: list[str], command: list[str] | None,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["submit", "--nats-url", nats_server.url, "--model", "mnist-like", "--gpus", "2",
            "--iterations", "300", "--job-id", "j1", *extra]
    assert await asyncio.to_thread(main, argv) == 0
    assert capsys.readouterr().out.strip() == "j1"
    (body,) = await stored_submissions(nats_server.url)
    assert (body["job_id"], body["model"], body["gpus"], body["iterations"]) == \
        ("j1", "mnist-like", 2, 300)
    assert body.get("command") == command
