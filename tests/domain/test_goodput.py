"""Pollux's goodput model: throughput, statistical efficiency, fitting, batch-size choice, and
the piecewise speed a job's epochs give it in the simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from domain.goodput import (
    CANDIDATES,
    GoodputModel,
    PerfParams,
    efficiency,
    fit_perf_params,
    fixed_split,
    gain,
    job_batch,
    model_for,
    step_time,
    throughput,
)
from domain.progress import advance_segments, seconds_to_finish
from schemas.job import GoodputProfile
from traces.readers import read_table
from traces.readers.pollux import PROFILE_DIR, applications, load_profile

P = PerfParams(alpha_c=0.1, beta_c=0.01, alpha_n=0.5, beta_n=0.02, alpha_r=0.2, beta_r=0.01,
               gamma=1.0)


def profile(**overrides: object) -> GoodputProfile:
    """Three epochs; the noise scale (var / sqr) grows epoch by epoch, as in real training."""
    fields: dict[str, object] = dict(
        perf=tuple(P), init_batch=32, max_batch=1024, min_local_batch=8, max_local_batch=128,
        epochs=(100.0, 200.0, 300.0), batch_sizes=(32, 1024),
        grad_sqr=((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)),
        grad_var=((1.0, 10.0, 100.0), (2.0, 20.0, 200.0)),
    )
    fields.update(overrides)
    return GoodputProfile.model_validate(fields)


# -- throughput -------------------------------------------------------------------------------

@pytest.mark.parametrize(("nodes", "replicas", "network"), [
    (1, 1, 1e-8 + 1e-8 * 1e-8),  # one GPU: no synchronisation
    (1, 4, 0.2 + 0.01 * 2),  # one node: alpha_r + beta_r * (replicas - 2)
    (2, 8, 0.5 + 0.02 * 6),  # across nodes: alpha_n + beta_n * (replicas - 2)
])
def test_step_time_is_compute_plus_network_without_overlap_when_gamma_is_1(
        nodes: int, replicas: int, network: float) -> None:
    compute = 0.1 + 0.01 * 64
    assert float(step_time(P, nodes, replicas, 64)) == pytest.approx(compute + network)
    # accumulation adds plain forward/backward passes before the synchronised one
    assert float(step_time(P, nodes, replicas, 64, 2)) == pytest.approx(
        3 * compute + network)
    assert float(throughput(P, nodes, replicas, 64, 2)) == pytest.approx(
        replicas * 64 * 3 / (3 * compute + network))


def test_a_large_gamma_overlaps_compute_and_network() -> None:
    overlapped = P._replace(gamma=10.0)
    compute, network = 0.1 + 0.01 * 64, 0.5 + 0.02 * 6
    t = float(step_time(overlapped, 2, 8, 64))
    assert max(compute, network) < t < 1.02 * max(compute, network)


# -- statistical efficiency ---------------------------------------------------------------------

def test_efficiency_is_the_noise_scale_ratio() -> None:
    sqr, var, m0 = 2.0, 30.0, 64
    pgns = m0 * var / sqr
    for m in (64, 128, 1000, 8192):
        assert float(efficiency(sqr, var, m0, m)) == pytest.approx((pgns + m0) / (pgns + m))
    assert float(efficiency(sqr, var, m0, m0)) == pytest.approx(1.0)
    assert float(gain(sqr, var, m0, m0)) == pytest.approx(1.0)
    # a step at a larger batch is worth more steps at M0, but less than proportionally
    assert 1.0 < float(gain(sqr, var, m0, 4 * m0)) < 4.0


def test_efficiency_without_gradient_signal_counts_a_step_as_one() -> None:
    assert float(gain(0.0, 0.0, 64, 256)) == 1.0


# -- fitting ------------------------------------------------------------------------------------

def test_fitting_recovers_the_step_times_it_was_given() -> None:
    truth = PerfParams(0.05, 0.004, 0.3, 0.01, 0.06, 0.002, 1.8)
    nodes, replicas, local = [], [], []
    for n, r in [(1, 1), (1, 2), (1, 4), (2, 2), (2, 8), (4, 16), (8, 32)]:
        for b in (16, 64, 256):
            nodes.append(n)
            replicas.append(r)
            local.append(b)
    step = step_time(truth, np.array(nodes), np.array(replicas), np.array(local))
    sync = step - (truth.alpha_c + truth.beta_c * np.array(local))
    fitted = fit_perf_params(nodes, replicas, local, step.tolist(), sync.tolist())
    predicted = step_time(fitted, np.array(nodes), np.array(replicas), np.array(local))
    assert np.max(np.abs(predicted / step - 1)) < 0.05


def test_fitting_pins_what_single_gpu_data_cannot_tell() -> None:
    local = [16.0, 32.0, 64.0]
    step = [0.2, 0.3, 0.5]
    sync = [0.001, 0.001, 0.001]
    fitted = fit_perf_params([1, 1, 1], [1, 1, 1], local, step, sync)
    assert fitted.alpha_r == pytest.approx(1e-8) and fitted.beta_r == pytest.approx(1e-8)
    assert fitted.alpha_n >= 1.1 * fitted.alpha_r  # Pollux's prior
    assert float(step_time(fitted, 1, 1, 32.0)) == pytest.approx(0.3, rel=0.05)


def test_fitting_refuses_sync_times_above_step_times() -> None:
    with pytest.raises(ValueError, match="exceed sync"):
        fit_perf_params([1], [1], [8], [0.1], [0.2])


@pytest.mark.parametrize("app", applications())
def test_the_bundled_profiles_fit_their_measured_placements(app: str) -> None:
    """Median error of the fitted step time over every measured placement (measured:
    bert 4 %, cifar10 6 %, deepspeech2 7 %, imagenet 5 %, ncf 7 %, yolov3 7 %)."""
    perf = PerfParams(*load_profile(app).perf)
    table = read_table(PROFILE_DIR / app / "placements.csv")
    rows = [(len(r[0]), sum(map(int, r[0])), float(r[1]), float(r[2]))
            for _, r in table.records]
    n, r, b, measured = (np.array(c) for c in zip(*rows, strict=True))
    error = np.abs(step_time(perf, n, r, b) / measured - 1)
    assert float(np.median(error)) < 0.08


# -- batch size -------------------------------------------------------------------------------

def test_a_fixed_batch_splits_as_pollux_splits_it() -> None:
    # one GPU above the initial batch: accumulate at least once
    assert fixed_split(1, 64, init_batch=32, max_batch=1024, max_local=128) == (32, 1)
    # the per-GPU memory limit forces accumulation
    assert fixed_split(4, 1000, init_batch=32, max_batch=1024, max_local=128) == (125, 1)
    assert fixed_split(4, 256, init_batch=32, max_batch=1024, max_local=128) == (64, 0)


def brute_force(model: GoodputModel, nodes: int, replicas: int, epoch: int) -> float:
    """The best goodput over Pollux's candidates, computed independently."""
    prof = model.profile
    best = 0.0
    low = max(prof.init_batch, prof.min_local_batch * replicas)
    for batch in np.geomspace(low, prof.max_batch, CANDIDATES):
        local = batch / replicas
        accum = max(math.ceil(local / prof.max_local_batch - 1e-8) - 1, 0)
        if replicas == 1 and local > prof.init_batch + 1e-8:
            accum = max(accum, 1)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        if not prof.min_local_batch <= atomic <= prof.max_local_batch:
            continue
        m = replicas * atomic * (accum + 1)
        w = (m - 32) / (1024 - 32)
        sqr = (1 - w) * prof.grad_sqr[0][epoch] + w * prof.grad_sqr[1][epoch]
        var = (1 - w) * prof.grad_var[0][epoch] + w * prof.grad_var[1][epoch]
        good = float(throughput(model.perf, nodes, replicas, atomic, accum)
                     * efficiency(sqr, var, prof.init_batch, m))
        best = max(best, good)
    return best


@pytest.mark.parametrize(("nodes", "replicas"), [(1, 1), (1, 3), (2, 8), (4, 16)])
def test_the_chosen_batch_size_maximises_goodput(nodes: int, replicas: int) -> None:
    model = GoodputModel(profile())
    for epoch in range(3):
        choice = model.best(nodes, replicas, epoch)
        assert choice.goodput == pytest.approx(brute_force(model, nodes, replicas, epoch))
        assert 8 <= choice.atomic <= 128  # the per-GPU memory limit
        assert 32 <= choice.batch <= 1024
        assert choice.batch == replicas * choice.atomic * (choice.accum + 1)
        assert choice.rate == pytest.approx(choice.goodput / 32)


def test_a_growing_noise_scale_and_more_gpus_favour_larger_batches() -> None:
    model = GoodputModel(profile())
    by_epoch = [model.best(1, 4, e).batch for e in range(3)]
    assert by_epoch == sorted(by_epoch) and by_epoch[0] < by_epoch[-1]
    by_gpus = [model.best(math.ceil(r / 4), r, 1).batch for r in (1, 2, 4, 8)]
    assert by_gpus == sorted(by_gpus)


def test_adapting_the_batch_size_is_about_as_fast_as_any_fixed_one_or_faster() -> None:
    # Pollux tries 50 batch sizes, so a fixed one between two of them may be a hair better.
    model = GoodputModel(profile())
    for batch in (64, 256, 1024):
        assert np.all(model.rates(1, 4) >= model.rates(1, 4, batch) * 0.99)
    assert np.all(model.rates(1, 4) > model.rates(1, 4, 32))


def test_a_job_that_cannot_adapt_keeps_its_batch_size() -> None:
    fixed = profile(adaptive=False)
    assert job_batch(fixed, 256, adaptive=True) == 256
    assert job_batch(profile(), 256, adaptive=True) is None
    assert job_batch(profile(), 256, adaptive=False) == 256
    assert job_batch(profile(), None, adaptive=False) == 32


def test_an_allocation_too_wide_for_the_batch_limits_runs_at_the_floor() -> None:
    model = GoodputModel(profile(max_batch=64, batch_sizes=(32, 64)))
    assert np.all(model.rates(4, 16) > 0)  # 16 GPUs x 8 per GPU > 64: no valid candidate


def test_models_are_shared_between_equal_profiles() -> None:
    assert model_for(profile()) is model_for(profile())


# -- speed by progress ----------------------------------------------------------------------------

def test_segments_follow_the_epochs_from_the_current_progress() -> None:
    model = GoodputModel(profile())
    rates = model.rates(1, 2)
    whole = model.segments(1, 2, 0.0)
    assert [u for u, _ in whole] == [100.0, 200.0, math.inf]
    assert [p for _, p in whole] == pytest.approx([1 / float(r) for r in rates])
    assert model.segments(1, 2, 150.0) == whole[1:]
    assert model.segments(1, 2, 300.0) == whole[2:]  # done: the last epoch's speed


def test_progress_through_segments_is_consistent() -> None:
    segments = ((10.0, 1.0), (20.0, 2.0), (math.inf, 4.0))
    # 30 iterations from 0: 10 s + 20 s + 40 s
    assert seconds_to_finish(30.0, 30.0, segments) == pytest.approx(70.0)
    assert seconds_to_finish(15.0, 30.0, segments) == pytest.approx(10.0 + 40.0)
    # 25 s of work from 0: 10 iterations in 10 s, then 7.5 in 15 s
    left = advance_segments(30.0, 30.0, last=0.0, ready_at=5.0, now=30.0, segments=segments,
                            lost_s=0.0)
    assert left == pytest.approx(30.0 - 17.5)
    assert advance_segments(30.0, 30.0, 0.0, 0.0, 70.0, segments, 0.0) == pytest.approx(0.0)
    assert advance_segments(30.0, 30.0, 0.0, 50.0, 40.0, segments, 0.0) == 30.0  # restarting


@pytest.mark.parametrize("bad", [
    dict(perf=(0.1, 0.01, 0.5, 0.02, 0.2, 0.01, 11.0)),
    dict(epochs=(100.0, 50.0, 300.0)),
    dict(grad_sqr=((1.0, 1.0), (1.0, 1.0))),
    dict(init_batch=2048),
    dict(batch_sizes=(1024, 32)),
])
def test_a_profile_is_checked(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        profile(**bad)
