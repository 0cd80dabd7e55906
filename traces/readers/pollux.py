"""Pollux (OSDI'21) workloads and application profiles (petuum/adaptdl, osdi21-artifact).

A workload CSV (`simulator/workloads/workload-N.csv`) has one row per job:
`name, time (submission, s), application, num_replicas, batch_size`. Pollux adapts every job's
GPUs and batch size; the baselines (Tiresias+TunedJobs) run `num_replicas` GPUs at
`batch_size`, which is what a job requests here (`gpus`, `batch_size`).

Each application has a profile folder (`simulator/traces/<app>/`): `placements.csv`
(`placement` = GPUs per node as digits, e.g. `22` = two nodes of 2, `local_bsz`, `step_time`,
`sync_time`), `scalability.csv` (`num_nodes, num_replicas, local_bsz, step_time, sync_time`)
and `validation-<batch size>.csv` (one row per epoch: cumulative statistical `progress`,
`iteration`, `metric`, `grad_sqr`, `grad_var`). `load_profile` turns a folder into a
`GoodputProfile`: step-time parameters fitted to every placement and scalability row
(`domain.goodput.fit_perf_params`), epoch boundaries (the smallest cumulative progress any
validation run reports at the end of each epoch, as Pollux's `get_progress`), and gradient
statistics per batch size and epoch. Batch limits as in Pollux's `applications.py`: initial and
largest batch size = the smallest and largest validated, per-GPU limits = the smallest and
largest profiled `local_bsz` (yolov3: at most 8 per GPU, Pollux's setting).

A job's `iterations` are its statistical progress to completion (rounded up), its
`iteration_time_s` the time per unit at its requested GPUs and batch size on 4-GPU nodes
(averaged over its epochs). Pollux's simulator keeps ncf at its workload batch size on one GPU;
so does this reader (`adaptive=False`, `max_gpus=1`).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable
from pathlib import Path

from schemas.job import GoodputProfile
from traces.bundled import DATA_DIR
from traces.errors import TraceError
from traces.readers._csv import Parsed, Table, TraceFormat, make_job, read_table

PROFILE_DIR = DATA_DIR / "pollux" / "traces"
NODE_GPUS = 4  # Pollux's cluster: 16 nodes x 4 GPUs (a job's nominal run time only)
_MAX_LOCAL = {"yolov3": 8}  # Pollux's applications.py: per-GPU memory limit
_FIXED_ON_ONE_GPU = frozenset({"ncf"})  # Pollux's simulator: ncf keeps batch 32768, 1 replica
_VALIDATION = re.compile(r"^validation-(\d+)\.csv$")
_COLUMNS = {"job_id": "name", "submit_time_s": "time", "model": "application",
            "gpus": "num_replicas", "batch_size": "batch_size"}


def applications(directory: Path = PROFILE_DIR) -> tuple[str, ...]:
    """Application names with a profile folder in `directory`."""
    if not directory.is_dir():
        return ()
    return tuple(sorted(p.name for p in directory.iterdir()
                        if p.is_dir() and (p / "placements.csv").is_file()))


def _columns(table: Table, required: tuple[str, ...]) -> None:
    missing = [c for c in required if c not in table.index]
    if missing:
        raise TraceError(table.path, 1, missing[0],
                         f"missing column; expected {', '.join(required)}")


def _throughput_rows(folder: Path) -> tuple[list[float], ...]:
    nodes: list[float] = []
    replicas: list[float] = []
    local: list[float] = []
    step: list[float] = []
    sync: list[float] = []
    placements = read_table(folder / "placements.csv")
    _columns(placements, ("placement", "local_bsz", "step_time", "sync_time"))
    for row in placements.rows():
        text = row.text("placement")
        if not text.isdigit() or "0" in text:
            raise row.error("placement", f"expected GPUs per node as digits 1-9, got {text!r}")
        nodes.append(len(text))
        replicas.append(sum(int(c) for c in text))
        local.append(row.positive_float("local_bsz"))
        step.append(row.positive_float("step_time"))
        sync.append(row.non_negative_float("sync_time"))
        if sync[-1] >= step[-1]:
            raise row.error("sync_time", f"must be below step_time ({step[-1]}), got {sync[-1]}")
    scalability = folder / "scalability.csv"
    if scalability.is_file():
        table = read_table(scalability)
        _columns(table, ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"))
        for row in table.rows():
            n, r = row.positive_int("num_nodes"), row.positive_int("num_replicas")
            if n > r:
                raise row.error("num_nodes", f"more nodes ({n}) than replicas ({r})")
            nodes.append(n)
            replicas.append(r)
            local.append(row.positive_float("local_bsz"))
            step.append(row.positive_float("step_time"))
            sync.append(row.non_negative_float("sync_time"))
            if sync[-1] >= step[-1]:
                raise row.error("sync_time",
                                f"must be below step_time ({step[-1]}), got {sync[-1]}")
    return nodes, replicas, local, step, sync


def _validation(folder: Path) -> dict[int, tuple[list[float], list[float], list[float]]]:
    """batch size → (cumulative progress, grad_sqr, grad_var) per epoch."""
    runs: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for path in sorted(folder.iterdir()):
        match = _VALIDATION.match(path.name)
        if match is None:
            continue
        table = read_table(path)
        _columns(table, ("progress", "grad_sqr", "grad_var"))
        progress: list[float] = []
        sqr: list[float] = []
        var: list[float] = []
        for row in table.rows():
            p = row.positive_float("progress")
            if progress and p <= progress[-1]:
                raise row.error("progress", f"must increase, got {p} after {progress[-1]}")
            progress.append(p)
            sqr.append(row.non_negative_float("grad_sqr"))
            var.append(row.non_negative_float("grad_var"))
        if not progress:
            raise TraceError(path, None, None, "no epochs")
        batch = int(match.group(1))
        if batch < 1:
            raise TraceError(path, None, None, "the batch size in the file name must be >= 1")
        runs[batch] = (progress, sqr, var)
    if not runs:
        raise TraceError(folder, None, None, "no validation-<batch size>.csv files")
    return runs


@functools.cache
def load_profile(application: str, directory: Path = PROFILE_DIR) -> GoodputProfile:
    """The goodput profile of one application's folder (fitted once per process)."""
    from domain.goodput import fit_perf_params  # policies import traces: import late

    folder = directory / application
    if not (folder / "placements.csv").is_file():
        raise TraceError(folder, None, None, "no placements.csv: not a Pollux profile folder")
    nodes, replicas, local, step, sync = _throughput_rows(folder)
    perf = fit_perf_params(nodes, replicas, local, step, sync)
    runs = _validation(folder)
    batches = sorted(runs)
    epochs = min(len(progress) for progress, _, _ in runs.values())
    ends = tuple(min(runs[b][0][e] for b in batches) for e in range(epochs))
    if any(b <= a for a, b in itertools.pairwise(ends)):
        raise TraceError(folder, None, None, "epoch boundaries (least progress) do not increase")
    return GoodputProfile(
        perf=tuple(perf),
        init_batch=batches[0],
        max_batch=batches[-1],
        min_local_batch=max(1, math.floor(min(local))),
        max_local_batch=_MAX_LOCAL.get(application, max(1, math.floor(max(local)))),
        epochs=ends,
        batch_sizes=tuple(batches),
        grad_sqr=tuple(tuple(runs[b][1][:epochs]) for b in batches),
        grad_var=tuple(tuple(runs[b][2][:epochs]) for b in batches),
        adaptive=application not in _FIXED_ON_ONE_GPU,
    )


def solo_seconds(profile: GoodputProfile, gpus: int, batch: int | None,
                 node_gpus: int = NODE_GPUS) -> float:
    """Run time of a whole job on `gpus` GPUs packed into nodes of `node_gpus`."""
    from domain.goodput import model_for

    model = model_for(profile)
    nodes = math.ceil(gpus / node_gpus)
    rates = model.rates(nodes, gpus, batch)
    seconds = 0.0
    start = 0.0
    for end, rate in zip(profile.epochs, rates, strict=True):
        seconds += (end - start) / float(rate)
        start = end
    return seconds


def make_reader(directory: Path = PROFILE_DIR) -> Callable[[Table], Parsed]:
    """A workload reader that takes application profiles from `directory`."""

    def read(table: Table) -> Parsed:
        known = applications(directory)
        out: Parsed = []
        for row in table.rows():
            app = row.text("application")
            if app not in known:
                raise row.error("application", f"unknown application {app!r}; profiles exist "
                                f"for {', '.join(known) or 'none'} (in {directory})")
            gpus = row.positive_int("num_replicas")
            batch = row.positive_int("batch_size")
            profile = load_profile(app, directory)
            fixed = not profile.adaptive
            if fixed and gpus != 1:
                raise row.error("num_replicas", f"{app} runs on one GPU (Pollux keeps it "
                                f"there), got {gpus}")
            seconds = solo_seconds(profile, gpus, batch)
            iterations = math.ceil(profile.epochs[-1])
            job = make_job(
                row, _COLUMNS,
                job_id=row.text("name"),
                submit_time_s=row.non_negative_float("time"),
                model=app,
                gpus=gpus,
                batch_size=batch,
                iterations=iterations,
                iteration_time_s=seconds / iterations,
                duration_s=seconds,
                max_gpus=1 if fixed else None,
                goodput=profile,
            )
            out.append((row.line, job))
        return out

    return read


FORMAT = TraceFormat(
    name="pollux",
    required=("name", "time", "application", "num_replicas", "batch_size"),
    optional=(),
    default_overhead="flat:30",  # Pollux's simulator: 30 s without progress after a rescale
    read=make_reader(),
)
