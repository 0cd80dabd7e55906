"""Pollux's goodput model (Qiao et al., OSDI'21), as pure functions of a `GoodputProfile`.

The formulas are Pollux's (petuum/adaptdl, branch osdi21-artifact, `simulator/goodput.py` and
`simulator/applications.py`); the code is Loom's own.

Throughput. One optimiser step of a job with `replicas` GPUs on `nodes` nodes, each GPU
computing an atomic batch of `atomic` examples `accum + 1` times (gradient accumulation), takes

    T_acc  = alpha_c + beta_c * atomic                       one forward/backward pass
    T_net  = alpha_n + beta_n * max(replicas - 2, 0)         if the job spans several nodes
           = alpha_r + beta_r * max(replicas - 2, 0)         if one node and replicas > 1
           = ~0                                              on one GPU
    T_step = accum * T_acc + (T_acc^gamma + T_net^gamma)^(1/gamma)

and processes M = replicas * atomic * (accum + 1) examples: throughput = M / T_step. The seven
parameters are fitted to a job type's measured step and sync times (`fit_perf_params`: RMS
error of log times plus Pollux's two regularisers, L-BFGS-B).

Statistical efficiency. With gradient statistics sqr (|g|^2) and var (its noise) measured at
the initial batch size M0 and scale = M / M0, one step at M is worth
gain = (var + sqr) / (var / scale + sqr) steps at M0, so efficiency = gain / scale
= (PGNS + M0) / (PGNS + M) with the gradient noise scale PGNS = M0 * var / sqr.

Goodput = throughput * efficiency (examples/s, counted as if at M0). A job's progress is
measured in steps at M0 weighted by gain (Pollux's statistical progress): it advances at
goodput / M0 = gain / T_step units per second, and is done when it reaches the progress at the
end of its last epoch. The statistics change from epoch to epoch (read from Pollux's
validation runs, interpolated linearly in the batch size), so a job's speed is piecewise
constant in its progress (`GoodputModel.segments`).

Batch size. For an allocation Pollux tries 50 total batch sizes spaced geometrically in
[max(M0, min_local * replicas), max_batch], splits each into (atomic, accum) within the per-GPU
memory limit [min_local, max_local], and keeps the best goodput (`GoodputModel.best`). One
difference from Pollux, whose job uses the statistics it last measured (at its current batch
size) for every candidate: each candidate is valued with the statistics at its own batch size,
i.e. the job picks the batch size that is truly best under the profile.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from schemas.job import GoodputProfile

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Num = NDArray[Any] | float  # a number or an array of them (numpy broadcasting)
Segments = tuple[tuple[float, float], ...]  # (progress up to, seconds per unit of progress)

CANDIDATES = 50  # batch sizes tried per allocation (Pollux: np.geomspace's default)
_EPS = 1e-8  # Pollux's tolerance for ceil/floor and its "zero" network time


class PerfParams(NamedTuple):
    alpha_c: float  # constant term of one forward/backward pass (s)
    beta_c: float  # per-example term of one pass (s)
    alpha_n: float  # inter-node synchronisation (s)
    beta_n: float  # inter-node retrogression per replica beyond 2 (s)
    alpha_r: float  # intra-node synchronisation (s)
    beta_r: float  # intra-node retrogression per replica beyond 2 (s)
    gamma: float  # overlap of compute and synchronisation, in [1, 10]


def accum_time(p: PerfParams, atomic: Num) -> FloatArray:
    """Seconds of one forward/backward pass over `atomic` examples per GPU."""
    return np.asarray(p.alpha_c + p.beta_c * np.asarray(atomic, dtype=float))


def network_time(p: PerfParams, nodes: Num, replicas: Num
                 ) -> FloatArray:
    """Seconds of gradient synchronisation (all-reduce) per optimiser step."""
    n = np.asarray(nodes, dtype=float)
    r = np.asarray(replicas, dtype=float)
    alpha = np.where(n > 1, p.alpha_n, np.where(r > 1, p.alpha_r, _EPS))
    beta = np.where(n > 1, p.beta_n, np.where(r > 1, p.beta_r, _EPS))
    return np.asarray(alpha + beta * np.maximum(r - 2, _EPS))


def step_time(p: PerfParams, nodes: Num, replicas: Num,
              atomic: Num, accum: Num = 0) -> FloatArray:
    """Seconds per optimiser step (`accum` extra accumulation passes before the synced one)."""
    t_acc = accum_time(p, atomic)
    t_net = network_time(p, nodes, replicas)
    g = p.gamma
    optim = (t_acc ** g + t_net ** g) ** (1.0 / g)
    return np.asarray(np.asarray(accum, dtype=float) * t_acc + optim)


def throughput(p: PerfParams, nodes: Num, replicas: Num,
               atomic: Num, accum: Num = 0) -> FloatArray:
    """Examples per second."""
    batch = np.asarray(replicas, dtype=float) * np.asarray(atomic, dtype=float) * (
        np.asarray(accum, dtype=float) + 1)
    return np.asarray(batch / step_time(p, nodes, replicas, atomic, accum))


def gain(sqr: Num, var: Num, init_batch: float,
         batch: Num) -> FloatArray:
    """Steps at `init_batch` that one step at `batch` is worth (1 at the initial batch)."""
    scale = np.asarray(batch, dtype=float) / init_batch
    s = np.asarray(sqr, dtype=float)
    v = np.asarray(var, dtype=float)
    denom = v / scale + s
    safe = np.where(denom > 0, denom, 1.0)
    return np.asarray(np.where(denom > 0, (v + s) / safe, 1.0))


def efficiency(sqr: Num, var: Num, init_batch: float,
               batch: Num) -> FloatArray:
    """Statistical efficiency of `batch` relative to `init_batch`, in (0, 1]."""
    return np.asarray(gain(sqr, var, init_batch, batch) * init_batch / np.asarray(batch))


# -- fitting ----------------------------------------------------------------------------------

def _objective(x: FloatArray, nodes: FloatArray, replicas: FloatArray, atomic: FloatArray,
               log_acc: FloatArray, log_step: FloatArray) -> float:
    p = PerfParams(*(float(v) for v in x))
    t_acc = accum_time(p, atomic)
    t_net = network_time(p, nodes, replicas)
    log_optim = np.log(t_acc ** p.gamma + t_net ** p.gamma) / p.gamma
    err_acc = math.sqrt(float(np.mean((np.log(t_acc) - log_acc) ** 2)))
    err_step = math.sqrt(float(np.mean((log_optim - log_step) ** 2)))
    reg_gamma = 1e-3 * (p.gamma - 1) ** 2  # prefer little overlap: easier to fit
    reg_retro = 1e-2 * ((p.beta_n / p.alpha_n) ** 2 + (p.beta_r / p.alpha_r) ** 2)  # optimism
    return err_acc + err_step + reg_gamma + reg_retro


def fit_perf_params(nodes: Sequence[float], replicas: Sequence[float],
                    atomic: Sequence[float], step_s: Sequence[float],
                    sync_s: Sequence[float]) -> PerfParams:
    """Fit the step-time model to measurements (Pollux's `fit_perf_params` objective).

    Each measurement is one configuration: nodes, replicas, atomic (per-GPU) batch size, the
    optimiser step time and the part of it spent synchronising; the forward/backward time is
    their difference. Parameters the data cannot identify are pinned as Pollux pins them
    (no multi-node data: no inter-node terms; no several-GPU single-node data: no intra-node
    terms; nothing above 2 replicas: no retrogression; one batch size: alpha_c is half the
    pass time).
    """
    from scipy.optimize import minimize

    n = np.asarray(nodes, dtype=float)
    r = np.asarray(replicas, dtype=float)
    b = np.asarray(atomic, dtype=float)
    step = np.asarray(step_s, dtype=float)
    acc = step - np.asarray(sync_s, dtype=float)
    if not (len(n) == len(r) == len(b) == len(step) == len(acc)) or len(n) == 0:
        raise ValueError("fit_perf_params: need equally long, non-empty measurement lists")
    if not (np.all(acc > 0) and np.all(np.isfinite(step)) and np.all(b > 0)):
        raise ValueError("fit_perf_params: step times must exceed sync times, batches be > 0")
    # The six time terms are searched in log space (better conditioned than Pollux's linear
    # space with exact gradients, which scipy's finite differences do not match), gamma as is.
    x0 = [math.log(1e-1), math.log(1e-2)] * 3 + [1.0 + 1e-3]
    lower = [math.log(1e-8)] * 6 + [1.0]
    upper = [math.log(1e6)] * 6 + [10.0]
    pins: dict[int, float] = {}
    if len(np.unique(b)) == 1:
        pins[0] = math.log(float(np.mean(acc)) / 2)
    if not np.any(n > 1):
        pins[2] = pins[3] = lower[2]
    if not np.any((n == 1) & (r > 1)):
        pins[4] = pins[5] = lower[4]
    if not np.any(r > 2):
        pins[3] = pins[5] = lower[3]
    for i, v in pins.items():
        x0[i] = lower[i] = upper[i] = v

    def objective(t: FloatArray) -> float:
        return _objective(np.concatenate([np.exp(t[:6]), t[6:]]), n, r, b, np.log(acc),
                          np.log(step))

    result = minimize(objective, np.array(x0), method="L-BFGS-B",
                      bounds=list(zip(lower, upper, strict=True)))
    x = [math.exp(float(v)) for v in result.x[:6]] + [float(result.x[6])]
    if not np.any(n > 1):  # Pollux's prior: crossing nodes is no cheaper than staying inside
        x[2] = max(x[2], x[4] * 1.1)
        x[3] = max(x[3], x[5] * 1.1)
    return PerfParams(*x)


# -- one job type's model -----------------------------------------------------------------------

class Choice(NamedTuple):
    """A job's configuration on an allocation, and what it achieves in one epoch."""

    batch: int  # total batch size: replicas * atomic * (accum + 1)
    atomic: int  # examples per GPU per pass
    accum: int  # extra accumulation passes per step
    goodput: float  # examples/s counted at the initial batch size
    rate: float  # statistical progress per second (goodput / init_batch)


def fixed_split(replicas: int, batch: int, init_batch: int, max_batch: int,
                max_local: int) -> tuple[int, int]:
    """(atomic, accum) for a fixed total batch size, as Pollux's simulator splits it."""
    local = math.ceil(batch / replicas - _EPS)
    accum = math.ceil(local / max_local - _EPS) - 1
    if replicas == 1 and batch > init_batch:
        accum = max(1, accum)  # one GPU: accumulate, so gradient statistics can be estimated
    atomic = math.ceil(local / (accum + 1) - _EPS)
    atomic = min(atomic, int(max_batch / (replicas * (accum + 1))))
    return max(atomic, 1), max(accum, 0)


class GoodputModel:
    """Pollux's goodput model of one job type (a `GoodputProfile`), with memoised tables.

    Tables are per allocation shape (nodes, replicas) and cover every epoch at once, so the
    scheduler's many queries cost a dictionary look-up after the first.
    """

    def __init__(self, profile: GoodputProfile) -> None:
        self.profile = profile
        self.perf = PerfParams(*profile.perf)
        self.init_batch = profile.init_batch
        self.max_batch = profile.max_batch
        self.min_local = profile.min_local_batch
        self.max_local = profile.max_local_batch
        self.epoch_ends = profile.epochs
        self.total = profile.epochs[-1]
        self._bs = np.asarray(profile.batch_sizes, dtype=float)
        self._sqr = np.asarray(profile.grad_sqr, dtype=float)  # batch size x epoch
        self._var = np.asarray(profile.grad_var, dtype=float)
        self._adaptive: dict[tuple[int, int], tuple[FloatArray, IntArray, IntArray]] = {}
        self._fixed: dict[tuple[int, int, int], tuple[FloatArray, int, int]] = {}

    @property
    def epochs(self) -> int:
        return len(self.epoch_ends)

    def epoch_at(self, progress: float) -> int:
        """The epoch a job that has made `progress` is in (the last one once done)."""
        return min(bisect.bisect_right(self.epoch_ends, progress), self.epochs - 1)

    def grad_stats(self, batch: Num) -> tuple[FloatArray, FloatArray]:
        """(sqr, var) for every epoch (last axis) at each batch size, interpolated linearly
        between the measured batch sizes (clamped outside them)."""
        b = np.asarray(batch, dtype=float)
        if len(self._bs) == 1:
            shape = (*b.shape, self.epochs)
            return (np.broadcast_to(self._sqr[0], shape).copy(),
                    np.broadcast_to(self._var[0], shape).copy())
        lo = np.clip(np.searchsorted(self._bs, b, side="right") - 1, 0, len(self._bs) - 2)
        w = np.clip((b - self._bs[lo]) / (self._bs[lo + 1] - self._bs[lo]), 0.0, 1.0)[..., None]
        sqr = (1 - w) * self._sqr[lo] + w * self._sqr[lo + 1]
        var = (1 - w) * self._var[lo] + w * self._var[lo + 1]
        return np.asarray(sqr), np.asarray(var)

    def _candidates(self, replicas: int) -> tuple[IntArray, IntArray, NDArray[np.bool_]]:
        """Pollux's `optimize` candidates for `replicas` GPUs: (atomic, accum, valid)."""
        low = max(self.init_batch, self.min_local * replicas)
        local = np.geomspace(low, self.max_batch, CANDIDATES) / replicas
        accum = np.ceil(local / self.max_local - _EPS) - 1
        if replicas == 1:
            accum = np.where(local > self.init_batch + _EPS, np.maximum(accum, 1), accum)
        accum = np.maximum(accum, 0).astype(np.int64)
        atomic = np.ceil(local / (accum + 1) - _EPS).astype(np.int64)
        valid = (self.min_local <= atomic) & (atomic <= self.max_local)
        return atomic, accum, valid

    def _adaptive_table(self, nodes: int, replicas: int
                        ) -> tuple[FloatArray, IntArray, IntArray]:
        """Per epoch: best goodput, its atomic batch and accumulation steps."""
        key = (nodes, replicas)
        hit = self._adaptive.get(key)
        if hit is not None:
            return hit
        atomic, accum, valid = self._candidates(replicas)
        if not valid.any():  # the allocation is too wide for the batch limits: run at the floor
            table = self._fixed_table(nodes, replicas, max(self.init_batch,
                                                           self.min_local * replicas))
            rates, a, k = table
            out = (rates * self.init_batch, np.full(self.epochs, a), np.full(self.epochs, k))
            self._adaptive[key] = out
            return out
        batch = replicas * atomic * (accum + 1)
        tput = throughput(self.perf, nodes, replicas, atomic, accum)  # (K,)
        sqr, var = self.grad_stats(batch)  # (K, E)
        good = tput[:, None] * efficiency(sqr, var, self.init_batch, batch[:, None])
        good = np.where(valid[:, None], good, 0.0)
        best = np.argmax(good, axis=0)  # first maximum: deterministic
        epochs = np.arange(self.epochs)
        out = (np.asarray(good[best, epochs]), atomic[best], accum[best])
        self._adaptive[key] = out
        return out

    def _fixed_table(self, nodes: int, replicas: int, batch: int
                     ) -> tuple[FloatArray, int, int]:
        """Per epoch: progress rate at a fixed total batch size; its (atomic, accum)."""
        key = (nodes, replicas, batch)
        hit = self._fixed.get(key)
        if hit is not None:
            return hit
        atomic, accum = fixed_split(replicas, batch, self.init_batch, self.max_batch,
                                    self.max_local)
        actual = replicas * atomic * (accum + 1)
        t = float(step_time(self.perf, nodes, replicas, atomic, accum))
        sqr, var = self.grad_stats(np.asarray(float(actual)))
        rates = gain(sqr, var, self.init_batch, float(actual)) / t
        out = (np.asarray(rates, dtype=float), atomic, accum)
        self._fixed[key] = out
        return out

    def rates(self, nodes: int, replicas: int, batch: int | None = None) -> FloatArray:
        """Statistical progress per second in each epoch: adaptive (the best batch size for
        the allocation, re-chosen every epoch) when `batch` is None, else at that batch."""
        if replicas < 1 or nodes < 1:
            raise ValueError(f"an allocation needs >= 1 node and replica, got {nodes}, {replicas}")
        if batch is None:
            return self._adaptive_table(nodes, replicas)[0] / self.init_batch
        return self._fixed_table(nodes, replicas, batch)[0]

    def choice(self, nodes: int, replicas: int, epoch: int, batch: int | None = None) -> Choice:
        """The configuration a job runs with in `epoch`, and its goodput."""
        if batch is None:
            good, atomic, accum = self._adaptive_table(nodes, replicas)
            a, k = int(atomic[epoch]), int(accum[epoch])
            g = float(good[epoch])
        else:
            rates, a, k = self._fixed_table(nodes, replicas, batch)
            g = float(rates[epoch]) * self.init_batch
        return Choice(replicas * a * (k + 1), a, k, g, g / self.init_batch)

    def best(self, nodes: int, replicas: int, epoch: int) -> Choice:
        """The goodput-maximising batch size for an allocation (Pollux's `optimize`)."""
        return self.choice(nodes, replicas, epoch)

    def segments(self, nodes: int, replicas: int, done: float, batch: int | None = None
                 ) -> Segments:
        """Piecewise-constant speed from progress `done` on: (progress up to, seconds per
        unit) for each epoch left; the last piece is open-ended."""
        rates = self.rates(nodes, replicas, batch)
        first = self.epoch_at(done)
        out = []
        for e in range(first, self.epochs):
            upto = self.epoch_ends[e] if e < self.epochs - 1 else math.inf
            r = float(rates[e])
            out.append((upto, 1.0 / r if r > 0 else math.inf))
        return tuple(out)


@functools.lru_cache(maxsize=128)
def model_for(profile: GoodputProfile) -> GoodputModel:
    """The (shared, memoised) model of a profile; equal profiles share one model."""
    return GoodputModel(profile)


def job_batch(profile: GoodputProfile, batch_size: int | None, adaptive: bool) -> int | None:
    """The fixed batch size a job runs with, or None when it adapts its batch size."""
    if adaptive and profile.adaptive:
        return None
    return batch_size if batch_size is not None else profile.init_batch
