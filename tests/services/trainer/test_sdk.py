"""The trainer SDK: its environment, its data order, and a user's script (examples/) run as
real processes through preemption, exact resume and a resize from 1 to 2 ranks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from loom.sdk import DataOrder, Environment, SdkError, session
from schemas.trainer import Finished, Progress, Record, Started, Stopped, decode
from tests.services.trainer.proc import ROOT, rendezvous_port

EXAMPLE = ROOT / "examples" / "train_mnist_like.py"


@pytest.mark.parametrize(("env", "needle"), [
    ({"RANK": "x"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be below WORLD_SIZE=2"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({"LOOM_ITERATIONS": "0"}, "LOOM_ITERATIONS=0 must be at least 1"),
    ({"LOOM_BATCH_SIZE": "big"}, "LOOM_BATCH_SIZE='big' is not an integer"),
    ({"LOOM_REPORT": "socket:1"}, "LOOM_REPORT='socket:1'"),
    ({"LOOM_GRACE_S": "soon"}, "LOOM_GRACE_S='soon' is not a number"),
    ({"LOOM_RENDEZVOUS_TIMEOUT_S": "0"}, "LOOM_RENDEZVOUS_TIMEOUT_S=0.0 must be above 0"),
])
def test_a_bad_environment_is_named(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SdkError, match=needle.replace("(", r"\(").replace("?", r"\?")):
        Environment.from_env(env)


@pytest.mark.parametrize(("env", "expect"), [
    ({}, Environment()),
    ({"LOOM_JOB_ID": "j", "RANK": "1", "WORLD_SIZE": "4", "LOOM_CHECKPOINT_DIR": "/c",
      "LOOM_ITERATIONS": "9", "LOOM_BATCH_SIZE": "64", "LOOM_GRACE_S": "7.5",
      "LOOM_RENDEZVOUS_TIMEOUT_S": "20"},
     Environment(job_id="j", rank=1, world_size=4, checkpoint_dir=Path("/c"), iterations=9,
                 batch_size=64, report="stdout", grace_s=7.5, rendezvous_timeout_s=20.0)),
])
def test_environment_from_loom_or_torchrun(env: dict[str, str], expect: Environment) -> None:
    assert Environment.from_env(env) == expect


def test_the_scheduler_s_numbers_win_over_the_script_s() -> None:
    s = session(iterations=10, batch_size=8, env={"LOOM_ITERATIONS": "30",
                                                  "LOOM_BATCH_SIZE": "16"})
    assert (s.iterations, s.batch_size) == (30, 16)
    with pytest.raises(SdkError, match="iterations"):
        session(env={})


@pytest.mark.parametrize(("n", "batch", "world"), [(10, 4, 1), (10, 4, 2), (7, 6, 3),
                                                   (100, 32, 4)])
def test_ranks_together_see_the_single_process_batch_at_any_position(
        n: int, batch: int, world: int) -> None:
    one, many = DataOrder(n, seed=3), DataOrder(n, seed=3)
    for start in range(0, 5 * n, batch):  # across several epochs
        joined = [i for r in range(world) for i in many.slice(start, batch, r, world)]
        assert joined == one.slice(start, batch, 0, 1)
    epoch = one.slice(0, n, 0, 1)
    assert sorted(epoch) == list(range(n)) and epoch != list(range(n))  # a permutation
    assert one.slice(n, n, 0, 1) != epoch  # a new order each epoch
    assert DataOrder(n, seed=3, shuffle=False).slice(n - 1, 2, 0, 1) == [n - 1, 0]


class Script:
    """One rank of the example script, with Loom's environment; records decoded as they come."""

    def __init__(self, tmp: Path, name: str, ckpt: Path, iterations: int, *, rank: int = 0,
                 world: int = 1, port: int = 0, rendezvous_s: float = 60.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LOOM_JOB_ID": "sdk-job",
               "LOOM_CHECKPOINT_DIR": str(ckpt), "LOOM_ITERATIONS": str(iterations),
               "LOOM_REPORT_EVERY": "5", "RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "LOOM_RENDEZVOUS_TIMEOUT_S": str(rendezvous_s)}
        self.log = tmp / f"{name}.stderr"
        self.err = open(self.log, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen([sys.executable, str(EXAMPLE)], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.records: list[Record] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.records.append(decode(line))  # stdout carries nothing but records
                self._cond.notify_all()

    def terminate_after(self, iteration: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: any(
                isinstance(r, Progress) and r.iteration >= iteration for r in self.records),
                timeout=120), self.records
        self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> int:
        try:
            code = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.log.name} still running after 120 s; its stderr:\n"
                                 + self.log.read_text()[-3000:]) from None
        finally:
            self.err.close()
        return code

    def only(self, kind: type[Record]) -> Record:
        (found,) = [r for r in self.records if isinstance(r, kind)]
        return found


def test_example_stops_resumes_exactly_and_resizes_to_two_ranks(tmp_path: Path) -> None:
    ckpt, total = tmp_path / "ckpt", 120
    first = Script(tmp_path, "first", ckpt, total)
    first.terminate_after(20)
    assert first.wait() == 0
    stop1 = first.only(Stopped)
    assert isinstance(stop1, Stopped) and 20 <= stop1.iteration < total

    second = Script(tmp_path, "second", ckpt, total)
    second.terminate_after(stop1.iteration + 15)
    assert second.wait() == 0
    start2, stop2 = second.only(Started), second.only(Stopped)
    assert isinstance(start2, Started) and isinstance(stop2, Stopped)
    assert (start2.resumed, start2.iteration) == (True, stop1.iteration)

    port = rendezvous_port()
    ranks = [Script(tmp_path, f"third{r}", ckpt, total, rank=r, world=2, port=port)
             for r in (0, 1)]
    assert [r.wait() for r in ranks] == [0, 0], [r.log.read_text()[-2000:] for r in ranks]
    start3, done = ranks[0].only(Started), ranks[0].only(Finished)
    assert isinstance(start3, Started) and isinstance(done, Finished)
    assert (start3.world_size, start3.checkpoint_world_size) == (2, 1)
    assert (start3.iteration, done.iteration) == (stop2.iteration, total)  # exactly the total
    assert ranks[1].records == []  # rank 0 speaks for the job

    # Exact resume: stopping and resuming at one rank gives the weights of a run that never
    # stopped (same bits), ...
    straight = Script(tmp_path, "straight", tmp_path / "other", stop2.iteration)
    assert straight.wait() == 0
    reference = straight.only(Finished)
    assert isinstance(reference, Finished)
    assert reference.param_digest == stop2.param_digest
    # ... and at two ranks the loss goes on where it was (a restart would jump back to ~2.3).
    before = [r.loss for r in second.records if isinstance(r, Progress)][-1]
    after = next(r.loss for r in ranks[0].records if isinstance(r, Progress))
    assert before is not None and after is not None
    assert abs(after - before) < 0.35 * before, (before, after)


def test_a_bare_torchrun_joins_as_the_node_agent_sets_it_up(tmp_path: Path) -> None:
    """The node agent runs a command once per GPU with torchrun's PET_* defaults, so
    `torchrun script.py`, unchanged, becomes one one-worker node of the job."""
    port, procs = rendezvous_port(), []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LOOM_JOB_ID": "tr",
               "LOOM_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "LOOM_ITERATIONS": "30",
               "PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": "1",
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", str(EXAMPLE)], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True))
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:  # torchrun and its worker, not left behind if one hangs
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0]
    records = [decode(line) for line in outs[0].splitlines()]
    assert outs[1] == ""  # rank 0 speaks for the job
    start, end = records[0], records[-1]
    assert isinstance(start, Started) and (start.world_size, start.backend) == (2, "gloo")
    assert isinstance(end, Finished) and end.iteration == 30


def test_a_rank_whose_peer_never_comes_fails_within_the_rendezvous_timeout(
        tmp_path: Path) -> None:
    """Not torch's 30-minute default: a missing rank (or a master port someone else holds)
    is an error the node agent can report, not a hang."""
    alone = Script(tmp_path, "alone", tmp_path / "ckpt", 10, rank=1, world=2,
                   port=rendezvous_port(), rendezvous_s=2.0)
    assert alone.wait() != 0
    assert "timeout" in alone.log.read_text().lower()
