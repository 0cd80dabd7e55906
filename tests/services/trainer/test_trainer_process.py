"""Real trainer processes training real (tiny) models on synthetic data.

Each test launches `python -m services.trainer` ranks as subprocesses (1 CPU thread each, at
most 2 at a time), reads their JSON-line records and checks progress, checkpoints, resume,
resize, fast-forward and errors.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from domain import trainer_config as config
from schemas import trainer as protocol
from schemas.trainer import (
    Checkpointed,
    Failed,
    Finished,
    Progress,
    Record,
    Started,
    Stopped,
)
from services.trainer import checkpoint, workloads
from services.trainer.checkpoint import param_digest
from services.trainer.comm import Local
from services.trainer.runner import Trainer
from tests.services.trainer.proc import TrainerProc, launch, rendezvous_port

R = TypeVar("R", bound=Record)

N = 300  # iterations of the SIGTERM/resume runs
FAMILY_BATCH = {"cnn": "32", "transformer": "16", "lstm": "32", "rl": "32"}


def _job(name: str, model: str, iterations: int, ckpt: Path, *extra: str) -> tuple[str, ...]:
    return ("--job-id", name, "--model", model, "--iterations", str(iterations),
            "--checkpoint-dir", str(ckpt), *extra)


def _every(n: int) -> tuple[str, ...]:
    """Progress every `n` iterations and never by the clock (default: also every 2 s), so
    the records a test counts do not depend on how fast the machine is."""
    return ("--report-every", str(n), "--report-interval", "0")


def _records(src: TrainerProc | list[Record]) -> list[Record]:
    return src.records if isinstance(src, TrainerProc) else src


def _progress(src: TrainerProc | list[Record]) -> list[Progress]:
    return [r for r in _records(src) if isinstance(r, Progress)]


def _one(src: TrainerProc | list[Record], kind: type[R]) -> R:
    found = [r for r in _records(src) if isinstance(r, kind)]
    assert len(found) == 1, (kind.__name__, _records(src))
    return found[0]


def _checkpoint_digest(directory: Path, model: str) -> tuple[checkpoint.CheckpointMeta, str]:
    obj = checkpoint.load(directory)
    assert obj is not None
    meta, state, _ = checkpoint.unpack(obj)
    net = workloads.make(model, 0).init_model(0)
    net.load_state_dict(state)
    return meta, param_digest(list(net.parameters()))


@dataclass
class _NoSignals:
    requested: bool = False
    signal: str | None = None

    def arm(self) -> None:
        return None


def _train_here(args: tuple[str, ...]) -> list[Record]:
    """The real training loop in this process (world size 1, 1 thread), records in a list."""
    records: list[Record] = []
    Trainer(config.parse(list(args)), Local(), torch.device("cpu"), records.append,
            _NoSignals(), time.perf_counter()).run()
    return records


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Record]]:
    """Each family trains 40 iterations from scratch with the real loop, in this process."""
    tmp = tmp_path_factory.mktemp("families")
    return {m: _train_here(_job(f"fam-{m}", m, 40, tmp / m, "--batch-size", FAMILY_BATCH[m],
                                *_every(10))) for m in FAMILY_BATCH}


@pytest.mark.parametrize("model", list(FAMILY_BATCH))
def test_each_family_learns(families: dict[str, list[Record]], model: str) -> None:
    records = families[model]
    assert [r.event for r in records] == [
        "started", "progress", "progress", "progress", "progress", "checkpointed", "finished"]
    losses = [r.loss for r in records if isinstance(r, Progress)]
    first, last = losses[0], losses[-1]
    assert first is not None and last is not None
    assert last < first - 0.05, losses


def test_periodic_checkpoints(tmp_path: Path) -> None:
    records = _train_here(_job("periodic", "rl", 25, tmp_path, "--checkpoint-every", "10",
                               "--report-every", "100"))
    saved = [(r.reason, r.iteration) for r in records if isinstance(r, Checkpointed)]
    assert saved == [("periodic", 10), ("periodic", 20), ("final", 25)]
    assert [r.event for r in records][-3:] == ["progress", "checkpointed", "finished"]


def test_single_process_reports_and_sigterm_resume_is_exact(tmp_path: Path) -> None:
    """A run stopped by SIGTERM and resumed from its checkpoint trains exactly like a run
    that was never stopped (here: the same loop in this process): same loss at every
    iteration, same final weights."""
    args = ("--batch-size", "32", "--report-every", "1")
    p = launch(tmp_path, "first", *_job("exact", "cnn", N, tmp_path / "ckpt", *args))
    p.wait_for(lambda r: isinstance(r, Progress) and r.iteration >= 60)
    p.signal()
    t_signal = time.monotonic()
    assert p.wait() == 0, p.stderr()
    stop_s = time.monotonic() - t_signal
    q = launch(tmp_path, "resumed", *_job("exact", "cnn", N, tmp_path / "ckpt", *args))
    ref = _train_here(_job("exact", "cnn", N, tmp_path / "ref", *args))
    assert q.wait() == 0, q.stderr()

    # The uninterrupted run: started, one progress per iteration, final checkpoint, finished.
    assert [r.event for r in ref] == (
        ["started"] + ["progress"] * N + ["checkpointed", "finished"])
    started = _one(ref, Started)
    assert isinstance(started, Started)
    assert (started.iteration, started.iterations_total, started.world_size) == (0, N, 1)
    assert not started.resumed and started.backend == "local" and started.startup_s > 0
    ref_progress = _progress(ref)
    assert [r.iteration for r in ref_progress] == list(range(1, N + 1))
    assert [r.stages is None for r in ref_progress[:3]] == [True, True, False]  # 2 warm-up
    for r in ref_progress[2:]:
        assert r.throughput > 0 and r.samples_per_s == pytest.approx(32 * r.throughput)
        assert r.stages is not None and r.stages.iterations == 1 and r.stages.comm_s >= 0
        assert r.stages.data_s + r.stages.compute_s + r.stages.comm_s <= r.stages.iteration_s
    ref_ckpt, ref_done = _one(ref, Checkpointed), _one(ref, Finished)
    assert isinstance(ref_ckpt, Checkpointed) and isinstance(ref_done, Finished)
    assert (ref_ckpt.reason, ref_ckpt.iteration, ref_done.iteration) == ("final", N, N)
    assert ref_done.profile is not None and ref_done.profile.iterations == N - 2
    meta, digest = _checkpoint_digest(tmp_path / "ref", "cnn")
    assert (meta.iteration, meta.world_size, meta.skipped_iterations) == (N, 1, 0)
    assert digest == ref_done.param_digest

    # SIGTERM: the step finishes, the checkpoint is written, the process exits 0 promptly.
    stopped = _one(p, Stopped)
    assert isinstance(stopped, Stopped) and stopped.signal == "SIGTERM"
    k = stopped.iteration
    assert 60 <= k < N
    assert stop_s < 30.0  # promptly: one step and a checkpoint, not the rest of the run
    assert [r.event for r in p.records][-2:] == ["checkpointed", "stopped"]
    ckpt = _one(p, Checkpointed)
    assert isinstance(ckpt, Checkpointed) and (ckpt.reason, ckpt.iteration) == ("preempt", k)
    assert [r.iteration for r in _progress(p)] == list(range(1, k))  # k is in `stopped`

    # The resumed launch continues at k, reaches exactly N, and its loss curve is the
    # uninterrupted one (not reset: the untrained loss is ~2.3).
    started = _one(q, Started)
    assert isinstance(started, Started)
    assert started.resumed and started.iteration == k and started.checkpoint_world_size == 1
    assert [r.iteration for r in _progress(q)] == list(range(k + 1, N + 1))
    curve = [r.loss for r in _progress(p)] + [stopped.loss] + [r.loss for r in _progress(q)]
    assert curve == [r.loss for r in ref_progress]
    first_loss, resumed_loss = ref_progress[0].loss, _progress(q)[0].loss
    assert first_loss is not None and resumed_loss is not None
    assert resumed_loss < 0.75 * first_loss
    done = _one(q, Finished)
    assert isinstance(done, Finished) and done.iteration == N
    assert done.param_digest == ref_done.param_digest
    assert [r.event for r in q.records][-2:] == ["checkpointed", "finished"]
    assert '"event": "finished"' in q.stderr()  # structlog JSON on stderr, not on stdout


def test_two_gloo_ranks_stop_together_then_resize_to_one(tmp_path: Path) -> None:
    port = str(rendezvous_port())
    ckpt = tmp_path / "ckpt"
    ranks = [
        launch(tmp_path, f"rank{r}", *_job("dp", "transformer", 400, ckpt, "--batch-size", "16",
                                         "--report-every", "5", "--world-size", "2",
                                         "--rank", str(r), "--master-port", port))
        for r in (0, 1)
    ]
    ranks[1].wait_for(lambda r: isinstance(r, Progress) and r.iteration >= 10)
    ranks[1].signal()  # only rank 1 is signalled: both must stop after the same iteration
    for p in ranks:
        assert p.wait() == 0, p.stderr()
    stops = [_one(p, Stopped) for p in ranks]
    assert all(isinstance(s, Stopped) for s in stops)
    s0, s1 = stops
    assert isinstance(s0, Stopped) and isinstance(s1, Stopped)
    assert (s0.signal, s1.signal) == ("peer", "SIGTERM")
    assert s0.iteration == s1.iteration and s0.loss == s1.loss
    assert s0.param_digest == s1.param_digest  # data-parallel replicas are identical
    for p in ranks:
        started = _one(p, Started)
        assert isinstance(started, Started) and started.backend == "gloo"
        assert all(r.stages is None or r.stages.comm_s > 0 for r in _progress(p))
    assert not ranks[1].of("checkpointed")  # rank 0 writes
    meta, digest = _checkpoint_digest(ckpt, "transformer")
    assert (meta.iteration, meta.world_size) == (s0.iteration, 2)
    assert digest == s0.param_digest
    before = _progress(ranks[0])[-1].loss

    k = s0.iteration
    one = launch(tmp_path, "resized", *_job("dp", "transformer", k + 30, ckpt, "--batch-size",
                                            "16", *_every(10)))
    assert one.wait() == 0, one.stderr()
    started = _one(one, Started)
    assert isinstance(started, Started)
    assert (started.world_size, started.iteration, started.checkpoint_world_size) == (1, k, 2)
    after = _progress(one)
    assert [r.iteration for r in after] == [k + 10, k + 20, k + 30]
    assert before is not None and after[0].loss is not None
    assert after[0].loss < 1.35 * before  # continues; an untrained model is near ln(64) = 4.2
    finished = _one(one, Finished)
    assert isinstance(finished, Finished) and finished.iteration == k + 30


def test_fast_forward_counts_at_the_measured_rate(tmp_path: Path) -> None:
    p = launch(tmp_path, "ff", *_job("ff", "lstm", 600, tmp_path / "ckpt", "--batch-size", "16",
                                     "--fast-forward", "20", "--warmup", "2",
                                     "--report-interval", "0.25"), via_fd=True)
    assert p.wait() == 0, p.stderr()
    assert p.proc.stdout is not None and p.proc.stdout.read() == ""  # records went to the fd
    progress = _progress(p)
    real = [r for r in progress if not r.fast_forward]
    ff = [r for r in progress if r.fast_forward]
    assert real[-1].iteration == 22 and ff and ff[-1].iteration == 600
    measured = ff[0].stages  # the launch's measured profile: 20 iterations after 2 warm-up
    assert measured is not None and measured.iterations == 20
    assert all(r.loss is None and r.stages == measured for r in ff)
    # After the switch the count advances at 1 / measured iteration time, not faster.
    ff_wall = ff[-1].ts - real[-1].ts
    expected = (600 - 22) * measured.iteration_s
    assert expected * 0.9 <= ff_wall <= expected * 1.5 + 1.0, (ff_wall, expected)
    finished = _one(p, Finished)
    assert finished.iteration == 600 and finished.profile == measured
    meta, digest = _checkpoint_digest(tmp_path / "ckpt", "lstm")
    assert (meta.iteration, meta.skipped_iterations) == (600, 600 - 22)
    assert digest == finished.param_digest


def test_launch_failures_are_clear(tmp_path: Path, families: dict[str, list[Record]]) -> None:
    done = _one(families["cnn"], Checkpointed)
    c = str(tmp_path / "c")
    procs = {  # all at once: most fail before importing torch
        "unknown": _job("bad", "resnet", 10, tmp_path / "c"),
        "rank": _job("bad", "cnn", 10, tmp_path / "c", "--rank", "2", "--world-size", "2"),
        "hvd": _job("bad", "cnn", 10, tmp_path / "c", "--backend", "horovod"),
        # A checkpoint of another run (here another seed) is refused, not silently used.
        "other": _job("fam-cnn", "cnn", 80, Path(done.path).parent, "--batch-size", "32",
                      "--seed", "7"),
        "alone": _job("alone", "cnn", 10, Path(c), "--world-size", "2", "--master-port",
                      str(rendezvous_port()), "--rendezvous-timeout", "1"),
    }
    p = {name: launch(tmp_path, name, *args) for name, args in procs.items()}
    codes = {name: proc.wait() for name, proc in p.items()}
    horovod = importlib.util.find_spec("horovod") is not None
    # With horovod installed, one rank runs alone without horovodrun (a world of one).
    assert codes == {"unknown": 2, "rank": 2, "hvd": 0 if horovod else 2, "other": 2,
                     "alone": 1}

    assert "--model: invalid choice: 'resnet'" in p["unknown"].stderr()  # argparse's usage
    assert not p["unknown"].records

    assert "--rank 2 must be below --world-size 2" in p["rank"].stderr()
    failed = _one(p["rank"], Failed)
    assert failed.error == "invalid_arguments" and failed.exit_code == 2
    assert "--rank 2 must be below" in failed.reason

    if not horovod:
        assert "horovod is not installed" in _one(p["hvd"], Failed).reason

    failed = _one(p["other"], Failed)
    assert failed.error == "CheckpointError" and failed.iteration is None
    assert "seed 7 (checkpoint has 0)" in failed.reason

    # A peer that never comes: a runtime failure (exit 1, retrying elsewhere may work).
    failed = _one(p["alone"], Failed)
    assert failed.exit_code == 1 and failed.iteration is None
    assert "1/2 clients joined" in failed.reason


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None or
                    shutil.which("horovodrun") is None,
                    reason="horovod is not installed (scripts/build-horovod builds it)")
def test_two_horovod_ranks_under_horovodrun_train_the_same_weights(tmp_path: Path) -> None:
    # horovodrun starts the same command for every rank and tells each its rank in
    # HOROVOD_RANK; the trainer checks that horovod agrees with its flags.
    trainer = (f"exec {sys.executable} -m services.trainer --job-id hvd --model cnn "
               f"--iterations 40 --checkpoint-dir {tmp_path / 'ck'} --backend horovod "
               "--rank $HOROVOD_RANK --world-size 2 --report-every 20 --log-level warning")
    done = subprocess.run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo",
                           "bash", "-c", trainer], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    finished = [protocol.decode(line.split(":", 1)[1]) for line in done.stdout.splitlines()
                if '"event":"finished"' in line]
    assert len(finished) == 2
    assert all(isinstance(f, protocol.Finished) and f.iteration == 40 for f in finished)
    digests = {f.param_digest for f in finished if isinstance(f, protocol.Finished)}
    assert len(digests) == 1  # both ranks hold the same weights
