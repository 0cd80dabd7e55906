"""The trainer's pure parts: protocol, arguments, accounting, checkpoint rules, workloads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pydantic
import pytest
import torch

from domain import trainer_config as config
from domain.workloads import FAMILIES, for_trace_model
from schemas.trainer import (
    Checkpointed,
    Failed,
    Finished,
    Progress,
    StageTimes,
    Started,
    Stopped,
    decode,
    encode,
)
from services.trainer import checkpoint, workloads
from services.trainer.accounting import (
    STREAM,
    FastForward,
    ReportClock,
    StageAccount,
    StepTimes,
    Window,
    derive_seed,
)
from services.trainer.comm import Local
from services.trainer.optim import Adam
from services.trainer.reporting import LaunchReport

BASE = ["--job-id", "j1", "--model", "cnn", "--iterations", "10", "--checkpoint-dir", "/tmp/x"]
STAGES = StageTimes(iterations=3, data_s=0.001, compute_s=0.01, comm_s=0.002, iteration_s=0.014)


# --- protocol --------------------------------------------------------------------------------

@pytest.mark.parametrize("record", [
    Started(job_id="j", rank=0, ts=1.0, model="cnn", world_size=2, backend="gloo", device="cpu",
            batch_size=32, iteration=5, iterations_total=10, resumed=True,
            checkpoint_world_size=1, startup_s=2.5),
    Progress(job_id="j", rank=1, ts=1.0, iteration=7, iterations_total=10, loss=0.5,
             throughput=100.0, samples_per_s=3200.0, fast_forward=False, stages=STAGES),
    Checkpointed(job_id="j", rank=0, ts=1.0, iteration=7, reason="preempt", path="/c/x.pt",
                 bytes=100, write_s=0.01),
    Stopped(job_id="j", rank=0, ts=1.0, iteration=7, signal="SIGTERM", loss=None,
            param_digest="ab", profile=None),
    Finished(job_id="j", rank=0, ts=1.0, iteration=10, loss=0.1, wall_s=3.0, param_digest="ab",
             profile=STAGES),
    Failed(job_id="j", rank=0, ts=1.0, reason="boom", error="RuntimeError", exit_code=1),
])
def test_records_round_trip_as_one_json_line(record: object) -> None:
    assert isinstance(record, pydantic.BaseModel)
    line = encode(record)  # type: ignore[arg-type]
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line)["v"] == 1
    assert decode(line) == record


@pytest.mark.parametrize("change", [{"event": "exploded"}, {"v": 2}, {"surprise": 1}])
def test_decode_rejects_unknown_records(change: dict[str, object]) -> None:
    good = json.loads(encode(Failed(job_id="j", rank=0, ts=1.0, reason="r", error="E",
                                    exit_code=1)))
    with pytest.raises(pydantic.ValidationError):
        decode(json.dumps({**good, **change}))


# --- arguments -------------------------------------------------------------------------------

def test_defaults_and_argv_round_trip() -> None:
    cfg = config.parse(BASE)
    assert (cfg.rank, cfg.world_size, cfg.backend, cfg.batch_size, cfg.seed) == (
        0, 1, "auto", 32, 0)
    again = config.parse(cfg.to_argv())
    assert again == cfg


HOROVOD = importlib.util.find_spec("horovod") is not None


@pytest.mark.parametrize(("extra", "message"), [
    (["--rank", "3", "--world-size", "2"], "--rank 3 must be below --world-size 2"),
    (["--batch-size", "10", "--world-size", "4"], "must be divisible by --world-size 4"),
    (["--iterations", "0"], "--iterations: Input should be greater than or equal to 1"),
    (["--report", "socket:1"], "use stdout, fd:N or file:PATH"),
    (["--report-every", "0", "--report-interval", "0"], "cannot both be 0"),
    (["--backend", "nccl", "--device", "cpu"], "--backend nccl needs --device cuda"),
    pytest.param(["--backend", "horovod"], "horovod is not installed",
                 marks=pytest.mark.skipif(HOROVOD, reason="horovod is installed here")),
    (["--job-id", "a b"], "--job-id: String should match pattern"),
])
def test_invalid_arguments_say_which_flag(extra: list[str], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message.replace("-", r"\-")):
        config.parse(BASE + extra)


def test_usable_report_falls_back_to_stdout() -> None:
    assert config.usable_report("fd:3") == "fd:3"
    assert config.usable_report("file:/tmp/r") == "file:/tmp/r"
    assert config.usable_report("fd:x") == config.usable_report("nonsense") == "stdout"


# --- accounting ------------------------------------------------------------------------------

def test_derived_seeds_are_stable_and_distinct() -> None:
    seeds = {derive_seed(s, STREAM, i) for s in range(3) for i in range(1000)}
    assert len(seeds) == 3000
    assert derive_seed(0, STREAM, 5) == derive_seed(0, STREAM, 5) < 2**63


def test_stage_account_means_per_iteration() -> None:
    acc = StageAccount()
    assert acc.summary() is None
    acc.add(StepTimes(0.1, 0.2, 0.3, 0.7))
    acc.add(StepTimes(0.3, 0.4, 0.1, 0.9))
    s = acc.summary()
    assert s is not None and s.iterations == 2
    assert (s.data_s, s.compute_s, s.comm_s, s.iteration_s) == pytest.approx((0.2, 0.3, 0.2, 0.8))


def test_window_loss_and_throughput() -> None:
    w = Window(started_at=10.0, start_iteration=100)
    assert w.loss() is None
    w.add_loss(1.0)
    w.add_loss(2.0)
    assert w.loss() == 1.5
    assert w.throughput(150, 12.0) == 25.0
    assert w.throughput(150, 10.0) == 0.0


def test_report_clock_by_count_and_by_time() -> None:
    c = ReportClock(every=10, interval=5.0, last_iteration=0, last_time=0.0)
    assert not c.due(9, 1.0) and c.due(10, 1.0) and c.due(3, 5.0)
    c.mark(10, 1.0)
    assert not c.due(10, 100.0)  # nothing new since the last record
    timed = ReportClock(every=0, interval=2.0, last_iteration=0, last_time=0.0)
    assert not timed.due(1000, 1.9) and timed.due(1, 2.0)


def test_fast_forward_advances_at_the_measured_rate() -> None:
    ff = FastForward(start=100, started_at=50.0, iteration_s=0.5, total=110)
    assert ff.position(50.0) == 100
    assert ff.position(50.49) == 100
    assert ff.position(50.5) == 101
    assert ff.position(52.0) == 104
    assert ff.position(1e9) == 110  # never beyond the job's total
    assert ff.time_of(104) == 52.0


def test_trace_model_names_map_to_families() -> None:
    muri = ["vgg16", "vgg19", "resnet18", "shufflenet_v2_x1_0", "bert", "gpt2", "a2c", "dqn"]
    assert [for_trace_model(m) for m in muri] == [
        "cnn", "cnn", "cnn", "cnn", "transformer", "transformer", "rl", "rl"]
    gavel = ["ResNet-50 (batch size 32)", "Transformer (batch size 16)", "LM (batch size 20)",
             "A3C", "CycleGAN", "Recommendation (batch size 512)"]
    assert [for_trace_model(m) for m in gavel] == [
        "cnn", "transformer", "lstm", "rl", "cnn", None]
    assert for_trace_model("deepspeech2") == "lstm"
    assert for_trace_model("inception3") == "cnn"


# --- checkpoint ------------------------------------------------------------------------------

def _meta(**kw: object) -> checkpoint.CheckpointMeta:
    base: dict[str, object] = dict(job_id="j1", model="cnn", seed=0, batch_size=32,
                                   iteration=7, world_size=2)
    return checkpoint.CheckpointMeta.model_validate({**base, **kw})


def test_checkpoint_round_trip_is_atomic(tmp_path: Path) -> None:
    wl = workloads.make("cnn", 0)
    model = wl.init_model(0)
    opt = wl.optimizer(model)
    (tmp_path / f".{checkpoint.FILENAME}.tmp-999").write_bytes(b"torn")  # a killed writer's
    assert checkpoint.load(tmp_path) is None
    assert list(tmp_path.iterdir()) == []  # the stale temporary file is gone
    path, size = checkpoint.save_atomic(
        checkpoint.pack(_meta(), model.state_dict(), opt.state_dict()), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.FILENAME]
    assert path.stat().st_size == size > 0
    meta, state, optim = checkpoint.unpack(checkpoint.load(tmp_path))
    assert meta == _meta()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert optim["steps"] == 0 and optim["algorithm"] == "adam"


def test_checkpoint_versions_and_format_are_checked() -> None:
    good = checkpoint.pack(_meta(), {}, {})
    with pytest.raises(checkpoint.CheckpointError, match="version 2 is not supported"):
        checkpoint.unpack({**good, "meta": {**good["meta"], "version": 2}})
    with pytest.raises(checkpoint.CheckpointError, match="format"):
        checkpoint.unpack({**good, "meta": {**good["meta"], "format": "other"}})
    with pytest.raises(checkpoint.CheckpointError, match="missing"):
        checkpoint.unpack({"model": {}})


def test_checkpoint_must_continue_the_same_data_stream() -> None:
    meta = _meta()
    checkpoint.check_compatible(meta, job_id="j1", model="cnn", seed=0, batch_size=32)
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"seed 1 \(checkpoint has 0\), global batch size 64"):
        checkpoint.check_compatible(meta, job_id="j1", model="cnn", seed=1, batch_size=64)
    with pytest.raises(checkpoint.CheckpointError, match="model 'rl'"):
        checkpoint.check_compatible(meta, job_id="j1", model="rl", seed=0, batch_size=32)


# --- a launch's report (shared by the trainer and the SDK) -------------------------------------

def test_launch_report_windows_carry_their_own_losses_and_stages() -> None:
    records: list[object] = []
    report = LaunchReport(records.append, job_id="j", rank=0, iterations_total=4,
                          report_every=2, report_interval=0)
    report.started(iteration=0, now=10.0, model="m", world_size=1, backend="local",
                   device="cpu", batch_size=8, checkpoint_world_size=None, startup_s=0.5)
    report.step(3.0, None)  # a warm-up iteration: its loss counts, its times do not
    assert not report.due(1, 10.5)
    report.step(1.0, StepTimes(0.1, 0.2, 0.0, 0.4))
    assert report.due(2, 11.0)
    report.progress(2, 11.0, batch_size=8)
    report.open_window(2, 12.0)  # fast-forward: a window of its own
    report.progress(4, 13.0, batch_size=8, fast_forward=True)
    report.finished(4, 1.0, 3.0, None)
    started, real, skipped, finished = records
    assert isinstance(started, Started) and (started.resumed, started.iteration) == (False, 0)
    assert isinstance(real, Progress) and (real.loss, real.throughput, real.samples_per_s) == (
        2.0, 2.0, 16.0)
    assert real.stages is not None and real.stages.iterations == 1
    assert isinstance(skipped, Progress) and skipped.fast_forward and skipped.loss is None
    assert skipped.stages == real.stages  # the measured rate, not a window's own
    assert isinstance(finished, Finished) and finished.profile == real.stages
    assert finished.param_digest == ""  # no parameters given


def test_launch_report_checkpoints_on_rank_0_and_checks_them_on_restore(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    records: list[object] = []
    ranks = [LaunchReport(records.append, job_id="j", rank=r, iterations_total=9,
                          report_every=0, report_interval=1) for r in (0, 1)]
    meta = _meta(job_id="j", iteration=3)
    assert ranks[1].save(tmp_path, meta, [("model", model)], "periodic") is None
    assert list(tmp_path.iterdir()) == [] and records == []
    done = ranks[0].save(tmp_path, meta, [("model", model)], "periodic")
    assert isinstance(done, Checkpointed) and records == [done] and done.iteration == 3

    def refuse(meta: checkpoint.CheckpointMeta, obj: dict[str, object]) -> None:
        raise checkpoint.CheckpointError("not this run's")

    with pytest.raises(checkpoint.CheckpointError, match="not this run's"):
        ranks[0].restore(Local(), tmp_path, model.parameters(), refuse)
    found = ranks[0].restore(Local(), tmp_path, model.parameters(), lambda m, o: None)
    assert found is not None and found[0] == meta and found[1]["optimizer"] == {}
    assert ranks[0].restore(Local(), None, model.parameters(), refuse) is None


# --- workloads -------------------------------------------------------------------------------

def test_registry_matches_the_catalog() -> None:
    assert workloads.REGISTRY.keys() == FAMILIES.keys()
    with pytest.raises(ValueError, match="unknown workload 'mlp'"):
        workloads.make("mlp", 0)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_seed_fixes_weights_and_data(name: str) -> None:
    a, b, c = workloads.make(name, 0), workloads.make(name, 0), workloads.make(name, 1)
    wa, wb, wc = (w.init_model(s).state_dict() for w, s in ((a, 0), (b, 0), (c, 1)))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)

    def batch(w: workloads.Workload, seed: int, i: int) -> tuple[torch.Tensor, ...]:
        return w.make_batch(torch.Generator().manual_seed(derive_seed(seed, STREAM, i)), 8)

    assert all(torch.equal(x, y) for x, y in zip(batch(a, 0, 3), batch(b, 0, 3), strict=True))
    assert not all(torch.equal(x, y)
                   for x, y in zip(batch(a, 0, 3), batch(a, 0, 4), strict=True))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_shard_gradients_average_to_the_global_batch_gradient(name: str) -> None:
    """Why a checkpoint resumes at another world size: W shards of the global batch, their
    gradients averaged, give the gradient of the whole batch."""
    wl = workloads.make(name, 0)
    model = wl.init_model(0)
    batch = wl.make_batch(torch.Generator().manual_seed(derive_seed(0, STREAM, 0)), 16)

    def grads(part: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        model.zero_grad()
        wl.loss(model, part).backward()  # type: ignore[no-untyped-call]
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole = grads(batch)
    halves = [grads(tuple(t[s] for t in batch)) for s in (slice(0, 8), slice(8, 16))]
    for g, h0, h1 in zip(whole, *halves, strict=True):
        torch.testing.assert_close((h0 + h1) / 2, g, rtol=1e-4, atol=1e-6)


def test_adam_matches_torch_optim_adam() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    mine, theirs = Adam(list(a.parameters()), lr=1e-2), torch.optim.Adam(b.parameters(), lr=1e-2)
    for _ in range(10):
        x = torch.randn(8, 5)
        for m, opt in ((a, mine), (b, theirs)):
            opt.zero_grad()
            (m(x) ** 2).mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q)
