"""Jobs that run their own command: the schema's bounds, the printed-progress parser, and the
node agent core spawning, reading, stopping and finishing them (pure; no processes)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from domain.textprogress import PrintedProgress, parse
from schemas.cluster import ClusterSpec
from schemas.codec import decode, decode_submission, encode
from schemas.events import JobFinished, Launch, NodeCommand, NodeStatus, Stop, TrainerReport
from schemas.events import envelope as make_envelope
from schemas.job import JobSpec, SubmitJob
from services.nodeagent.agent import Kill, Spawn, TrainerNodeCore, TrainerSettings
from services.runtime.effects import Effect, Publish
from tests.builders import make_job

BASE: dict[str, Any] = {"model": "custom", "gpus": 1, "iterations": 10,
                        "iteration_time_s": 1.0}
CLUSTER = ClusterSpec.uniform(1, 1, 2)
NODE = CLUSTER.nodes[0].node_id
SETTINGS = TrainerSettings(python="py", checkpoint_root=Path("/ckpt"), grace_s=7.0)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"command": []}, "command"),
    ({"command": ["python", ""]}, "command.1"),
    ({"command": ["x"] * 257}, "command"),
    ({"command": ["a" * 4097]}, "command.0"),
    ({"env": {"A": "1"}}, "env only apply to a job with a command"),
    ({"command": ["x"], "env": {"1BAD": "v"}}, "env.1BAD"),
    ({"command": ["x"], "env": {"RANK": "3", "LOOM_X": "1"}},
     "env: LOOM_X, RANK are set by Loom's node agent"),
    ({"command": ["x"], "cwd": "relative/dir"}, "cwd must be an absolute path"),
    ({"command": ["x"], "progress_regex": "(unclosed"}, "progress_regex does not compile"),
    ({"command": ["x"], "progress_regex": r"step (\d+)"}, "named group (?P<iteration>"),
])
def test_bad_commands_are_refused_with_what_is_wrong(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        SubmitJob.model_validate({**BASE, **extra})
    assert needle in str(info.value)


def test_a_command_job_survives_json_submission_and_msgpack() -> None:
    body = {**BASE, "command": ["python", "train.py", "--lr", "0.1"], "env": {"A": "1"},
            "cwd": "/srv", "progress_regex": r"it (?P<iteration>\d+)"}
    env = decode_submission(json.dumps(body).encode(), fallback_id="j1", now=5.0,
                            producer="t")
    spec = env.body.to_spec("j1", 5.0)  # type: ignore[union-attr]
    assert spec.command == ("python", "train.py", "--lr", "0.1") and spec.cwd == "/srv"
    cmd = NodeCommand(node_id=NODE, cycle=1, launches=(
        Launch(job_id="j1", spec=spec, placement=((NODE, (0,)),)),))
    again = decode(encode(make_envelope(cmd, event_id="e", occurred_at=0.0, producer="t",
                                        causation_id=None))).body
    assert again == cmd


@pytest.mark.parametrize(("line", "regex", "expect"), [
    ("LOOM_PROGRESS iteration=120 loss=0.53", None, PrintedProgress(120, 0.53)),
    ("LOOM_PROGRESS loss=1e-3 epoch=2 iteration=7", None, PrintedProgress(7, 0.001)),
    ("LOOM_PROGRESS iteration=8", None, PrintedProgress(8, None)),
    ("LOOM_PROGRESS iteration=8 loss=nan", None, PrintedProgress(8, None)),
    ("LOOM_PROGRESS loss=0.5", None, None),
    ("LOOM_PROGRESS iteration=-1", None, None),
    ("LOOM_PROGRESS iteration=ten", None, None),
    ("progress iteration=3", None, None),
    ("epoch 1 step 1,200 loss 0.25", r"step (?P<iteration>[\d,]+) loss (?P<loss>\S+)",
     PrintedProgress(1200, 0.25)),
    ("LOOM_PROGRESS iteration=5", r"step (?P<iteration>\d+)", None),
])
def test_printed_progress(line: str, regex: str | None, expect: PrintedProgress | None) -> None:
    assert parse(line, re.compile(regex) if regex else None) == expect


def command_spec(job: str, gpus: int, **extra: Any) -> JobSpec:
    spec = make_job(job).gpus(gpus).iterations(50).model("custom").build()
    return JobSpec(**{**spec.model_dump(), "command": ("python", "train.py"), **extra})


def run(core: TrainerNodeCore, cycle: int, *, launches: tuple[Launch, ...] = (),
        stops: tuple[Stop, ...] = ()) -> list[Effect]:
    return core.handle(make_envelope(NodeCommand(node_id=NODE, cycle=cycle, launches=launches,
                                                 stops=stops),
                                     event_id=f"c{cycle}", occurred_at=0.0, producer="placer",
                                     causation_id=None), 0.0)


def published(effects: list[Effect]) -> list[object]:
    return [e.body for e in effects if isinstance(e, Publish)]


def started(gpus: int = 2, **extra: Any) -> TrainerNodeCore:
    core = TrainerNodeCore(CLUSTER.nodes[0], ["GPU-a", "GPU-b"], SETTINGS)
    spec = command_spec("j", gpus, **extra)
    run(core, 1, launches=(Launch(job_id="j", spec=spec,
                                  placement=((NODE, tuple(range(gpus))),)),))
    return core


def test_each_rank_runs_the_command_with_torchrun_and_loom_variables() -> None:
    core = TrainerNodeCore(CLUSTER.nodes[0], ["GPU-a", "GPU-b"], SETTINGS)
    spec = command_spec("j", 2, env={"EXTRA": "1"}, cwd="/srv", batch_size=33)
    effects = run(core, 4, launches=(Launch(job_id="j", spec=spec,
                                            placement=((NODE, (0, 1)),)),))
    spawns = [e for e in effects if isinstance(e, Spawn)]
    assert [(s.rank, s.argv, s.gpu_uuids, s.cwd) for s in spawns] == [
        (0, ("python", "train.py"), ("GPU-a",), "/srv"),
        (1, ("python", "train.py"), ("GPU-b",), "/srv")]
    env = [dict(s.env) for s in spawns]
    assert [(e["RANK"], e["PET_NODE_RANK"]) for e in env] == [("0", "0"), ("1", "1")]
    for e in env:
        assert (e["WORLD_SIZE"], e["PET_NNODES"], e["LOCAL_RANK"]) == ("2", "2", "0")
        assert e["MASTER_PORT"] == e["PET_MASTER_PORT"] and e["MASTER_ADDR"] == "127.0.0.1"
        assert e["LOOM_CHECKPOINT_DIR"] == "/ckpt/j" and e["LOOM_ITERATIONS"] == "50"
        assert e["LOOM_BATCH_SIZE"] == "34"  # split evenly over two ranks
        assert e["LOOM_GRACE_S"] == "7.0" and e["EXTRA"] == "1"


def test_printed_progress_is_reported_and_an_exit_0_finishes_at_the_printed_count() -> None:
    core = started()
    assert core.on_output("j", 1, "LOOM_PROGRESS iteration=3") == []  # rank 0 speaks
    assert core.on_output("j", 0, "hello") == []
    [report] = published(core.on_output("j", 0, "LOOM_PROGRESS iteration=3 loss=0.5"))
    assert report == TrainerReport(job_id="j", node_id=NODE, event="progress", iteration=3,
                                   loss=0.5)
    assert core.on_exit("j", 1, 0) == []
    [done] = published(core.on_exit("j", 0, 0))
    assert done == JobFinished(job_id="j", node_id=NODE, iterations_done=3.0)


def test_a_silent_command_that_exits_0_did_all_its_iterations() -> None:
    core = started(gpus=1)
    [done] = published(core.on_exit("j", 0, 0))
    assert isinstance(done, JobFinished) and done.iterations_done == 50


def test_a_custom_regex_reads_the_job_s_own_format() -> None:
    core = started(gpus=1, progress_regex=r"step (?P<iteration>\d+)")
    assert core.on_output("j", 0, "LOOM_PROGRESS iteration=9") == []
    [report] = published(core.on_output("j", 0, "step 12"))
    assert isinstance(report, TrainerReport) and report.iteration == 12


def test_a_stopped_command_reports_its_progress_and_restarts_from_the_command() -> None:
    core = started(gpus=1)
    core.on_output("j", 0, "LOOM_PROGRESS iteration=20")
    kills = run(core, 2, stops=(Stop(job_id="j", reason="preempted"),))
    assert kills == [Kill("j", 0, 7.0)]
    [status] = published(core.on_exit("j", 0, -15))  # SIGTERM's default: not a finish
    assert status == NodeStatus(node_id=NODE, cycle=2, progress={"j": 20.0})


def test_a_failing_command_is_reported_as_a_failure_not_a_finish() -> None:
    core = started(gpus=1)
    effects = published(core.on_exit("j", 0, 3))
    finished = [b for b in effects if isinstance(b, JobFinished)]
    assert finished and all(b.failure for b in finished)  # the scheduler retries it


@pytest.mark.parametrize(("argv", "needle"), [
    (["--env", "RANK=1", "--command", "python", "t.py"], "RANK are set by Loom"),
    (["--env", "NOEQUALS", "--command", "python", "t.py"], "--env 'NOEQUALS': use NAME=VALUE"),
    (["--cwd", "/srv"], "--env, --cwd and --progress-regex need --command"),
])
def test_loom_submit_refuses_a_bad_command_before_sending(argv: list[str], needle: str) -> None:
    from loom.cli import build_parser
    from loom.live_cli import _submit

    args = build_parser().parse_args(["submit", "--nats-url", "nats://127.0.0.1:1", "--model",
                                      "m", "--gpus", "1", "--iterations", "5", *argv])
    with pytest.raises(ValueError, match=re.escape(needle)):
        asyncio.run(_submit(args, "j"))


def test_loom_submit_command_takes_the_rest_of_the_line() -> None:
    from loom.cli import build_parser

    args = build_parser().parse_args(["submit", "--model", "m", "--gpus", "1", "--iterations",
                                      "5", "--env", "A=1", "--command", "torchrun",
                                      "--nproc-per-node", "1", "train.py", "--lr", "0.1"])
    assert args.job_command == ["torchrun", "--nproc-per-node", "1", "train.py", "--lr", "0.1"]
    assert args.env == ["A=1"]
