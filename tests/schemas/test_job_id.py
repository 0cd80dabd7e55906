"""One job-id rule: the submit schema, every event that names a job, the trainer's config and
the node agent's checkpoint path accept and refuse the same ids.

Before, the submit schema allowed '/' (so `../../x` and absolute paths) while the trainer's
config did not: the launch was dead-lettered and the job held its GPUs with no process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from domain.trainer_config import TrainerConfig
from schemas.events import JobFinished, OperatorCommand
from schemas.job import SubmitJob
from services.nodeagent.agent import checkpoint_dir

GOOD = ["job-1a2b", "a", "0", "application_1506638472019_10238", "exp.v2:run-3", "x" * 128]
BAD = ["../../x", "/etc/passwd", "a/b", ".", "..", ".hidden", "-rf", "", "with space",
       "tab\tid", "new\nline", "é", "x" * 129, "a\\b", "~root"]


def submit(job_id: str) -> SubmitJob:
    return SubmitJob.model_validate({"job_id": job_id, "model": "resnet18", "gpus": 1,
                                     "iterations": 10, "iteration_time_s": 1.0})


def trainer(job_id: str) -> TrainerConfig:
    return TrainerConfig(job_id=job_id, model="cnn", iterations=10, batch_size=1,
                         checkpoint_dir="/ckpt")


ACCEPTORS = {
    "submit": submit,
    "finished": lambda j: JobFinished(job_id=j, node_id="n0", iterations_done=1.0),
    "operator": lambda j: OperatorCommand(command="cancel", job_id=j),
    "trainer": trainer,
    "checkpoint": lambda j: checkpoint_dir(Path("/ckpt"), j),
}


@pytest.mark.parametrize("where", ACCEPTORS)
@pytest.mark.parametrize("job_id", GOOD)
def test_every_place_accepts_the_same_ids(where: str, job_id: str) -> None:
    ACCEPTORS[where](job_id)


@pytest.mark.parametrize("where", ACCEPTORS)
@pytest.mark.parametrize("job_id", BAD)
def test_every_place_refuses_the_same_ids(where: str, job_id: str) -> None:
    with pytest.raises((ValidationError, ValueError)):
        ACCEPTORS[where](job_id)


def test_a_checkpoint_directory_is_one_level_under_the_root() -> None:
    assert checkpoint_dir(Path("/ckpt"), "job-1") == Path("/ckpt/job-1")
