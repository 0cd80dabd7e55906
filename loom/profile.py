"""`loom profile`: measure a bundled workload with the real trainer, as the policies need it.

For each workload and each world size 1, 2, 4, … up to `--max-gpus`, it launches real trainer
ranks (`python -m services.trainer`, gloo on CPU, one rank per GPU where there are GPUs), lets
them train for `--seconds`, stops them with SIGTERM (they checkpoint) and reads rank 0's
`stopped` record: iterations/s after warm-up and the mean data / compute / communication time
per iteration. It then relaunches from that checkpoint at the same size (restart) and at the
next size (resize, 1→2 as ElasticFlow's Fig. 12), and measures the time a launch loses: from
spawning the processes until `--probe` new iterations are done, less those iterations at the
steady rate. `--repeats` repeats everything; tables hold the median, `profile.json` every run.

Written to OUT:
- `throughputs/<workload>.csv`: ElasticFlow's format (`global_batch_size,1,2,…`, it/s of the
  whole job), read by `loom sim --profile OUT` (and `traces.measured`);
- `throughputs.json`: Gavel's format (`{"<device>": {"('<workload>', <n>)": {"null": it/s}}}`);
- `stages.json`: per workload and size, the stage times (Muri's resource times 0-2);
- `overheads.json`: start, restart, resize and stop seconds per workload and size, which
  `--overhead profile:OUT/overheads.json` charges in a simulation;
- `profile.json`: every measurement of every repeat (the spread).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from domain.workloads import FAMILIES
from schemas.trainer import Failed, Progress, Record, Stopped, decode
from services.runtime.natsserver import free_port

ROOT = Path(__file__).resolve().parents[1]
OVERHEADS_FORMAT = "loom.overheads.v1"


class ProfileError(RuntimeError):
    """A measurement could not be taken (a trainer failed, stalled or exited early)."""


@dataclass(frozen=True)
class ProfileOptions:
    models: tuple[str, ...]
    out: Path
    max_gpus: int = 2
    seconds: float = 4.0  # training time per throughput point, after start-up
    batch_size: int = 32  # global batch
    repeats: int = 1
    probe: int = 10  # new iterations a restart/resize launch must finish
    warmup: int = 3
    threads: int = 1
    device: str = "cpu"  # the GPU type name in the tables
    data: dict[str, str] = field(default_factory=dict)  # workload → dataset path
    python: str = sys.executable
    timeout_s: float = 120.0

    def validate(self) -> None:
        unknown = [m for m in self.models if m not in FAMILIES]
        if not self.models or unknown:
            raise ValueError(f"--models {','.join(self.models) or '(empty)'}: unknown "
                             f"{', '.join(unknown) or 'nothing given'}; choose from "
                             f"{', '.join(FAMILIES)}")
        if self.max_gpus < 1:
            raise ValueError(f"--max-gpus {self.max_gpus} must be >= 1")
        if self.batch_size % max(gpu_counts(self.max_gpus)):
            raise ValueError(f"--batch-size {self.batch_size} must be divisible by every "
                             f"profiled size {gpu_counts(self.max_gpus)}")
        if self.seconds <= 0 or self.repeats < 1 or self.probe < 1:
            raise ValueError("--seconds must be > 0, --repeats and --probe >= 1")
        for model, path in self.data.items():
            if model not in self.models:
                raise ValueError(f"--data {model}={path}: {model} is not being profiled")
            if not Path(path).exists():
                raise ValueError(f"--data {model}={path}: no such file or directory")


def gpu_counts(max_gpus: int) -> list[int]:
    """1, 2, 4, … up to `max_gpus` (and `max_gpus` itself when it is not a power of two)."""
    counts, n = [], 1
    while n <= max_gpus:
        counts.append(n)
        n *= 2
    if counts[-1] != max_gpus:
        counts.append(max_gpus)
    return counts


# --- one launch of W trainer ranks -------------------------------------------------------------

@dataclass
class _Rank:
    proc: subprocess.Popen[str]
    records: queue.Queue[tuple[float, Record] | None]
    stderr: Path


class Launch:
    """W ranks of one job; records arrive with the wall time they were read."""

    def __init__(self, opts: ProfileOptions, model: str, world: int, ckpt: Path,
                 logs: Path, tag: str) -> None:
        self.world = world
        port = free_port()
        self.t_spawn = time.time()
        self.ranks: list[_Rank] = []
        for rank in range(world):
            argv = [opts.python, "-m", "services.trainer", "--job-id", f"profile-{model}",
                    "--model", model, "--iterations", "100000000", "--checkpoint-dir", str(ckpt),
                    "--batch-size", str(opts.batch_size), "--rank", str(rank),
                    "--world-size", str(world), "--master-port", str(port),
                    "--threads", str(opts.threads), "--warmup", str(opts.warmup),
                    "--report-every", "1", "--log-level", "warning", "--device", "auto"]
            if model in opts.data:
                argv += ["--data", opts.data[model]]
            log = logs / f"{tag}-rank{rank}.stderr"
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
                   "CUDA_VISIBLE_DEVICES": _device_for(rank)}
            with log.open("w") as err:
                proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                                        text=True, env=env)
            q: queue.Queue[tuple[float, Record] | None] = queue.Queue()
            threading.Thread(target=_read, args=(proc, q), daemon=True).start()
            self.ranks.append(_Rank(proc, q, log))

    def until(self, pred: Callable[[Record], bool], timeout_s: float) -> tuple[float, Record]:
        """Rank 0's first record matching `pred` (and when it was read)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self.ranks[0].records.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise ProfileError(f"trainer did not report in {timeout_s:.0f} s; see "
                                   f"{self.ranks[0].stderr}") from None
            if item is None:
                raise ProfileError(f"trainer exited early; see {self.ranks[0].stderr}")
            if isinstance(item[1], Failed):
                self.kill()
                raise ProfileError(f"trainer failed: {item[1].reason} (see "
                                   f"{self.ranks[0].stderr})")
            if pred(item[1]):
                return item

    def stop(self, timeout_s: float) -> tuple[Stopped, float]:
        """SIGTERM every rank; rank 0's `stopped` record and seconds until every rank exited."""
        t0 = time.monotonic()
        for r in self.ranks:
            r.proc.send_signal(signal.SIGTERM)
        _, record = self.until(lambda r: isinstance(r, Stopped), timeout_s)
        for r in self.ranks:
            r.proc.wait(timeout_s)
        assert isinstance(record, Stopped)
        return record, time.monotonic() - t0

    def kill(self) -> None:
        for r in self.ranks:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()


def _device_for(rank: int) -> str:
    """One GPU per rank, as the node agent gives them (harmless where there are none)."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return visible[rank % len(visible)] if visible else str(rank)


def _read(proc: subprocess.Popen[str], q: queue.Queue[tuple[float, Record] | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        q.put((time.time(), decode(line)))
    q.put(None)


def _progress_at(iteration: int) -> Callable[[Record], bool]:
    return lambda r: isinstance(r, Progress) and r.iteration >= iteration


# --- measurements ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One world size of one workload, one repeat."""

    model: str
    gpus: int
    iterations_per_s: float
    data_s: float
    compute_s: float
    comm_s: float
    iteration_s: float
    start_s: float  # a cold launch: spawn until `probe` iterations, less their steady time
    restart_s: float  # the same from this size's checkpoint
    stop_s: float  # SIGTERM until every rank exited (the checkpoint is written meanwhile)
    resize_from: int | None = None  # the size whose checkpoint `resize_s` relaunched from
    resize_s: float | None = None


def _lost(t_spawn: float, t_done: float, iterations: int, iteration_s: float) -> float:
    return max(0.0, t_done - t_spawn - iterations * iteration_s)


def measure(opts: ProfileOptions, model: str, work: Path,
            say: Callable[[str], None]) -> list[Point]:
    """Every size of one workload, once."""
    points: list[Point] = []
    ckpts: dict[int, Path] = {}
    logs = opts.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for world in gpu_counts(opts.max_gpus):
        ckpt = ckpts[world] = work / f"{model}-w{world}"
        shutil.rmtree(ckpt, ignore_errors=True)
        run = Launch(opts, model, world, ckpt, logs, f"{model}-w{world}")
        try:
            t_probe, _ = run.until(_progress_at(opts.probe), opts.timeout_s)
            time.sleep(opts.seconds)
            stopped, stop_s = run.stop(opts.timeout_s)
        finally:
            run.kill()
        stages = stopped.profile
        if stages is None or stages.iteration_s <= 0:
            raise ProfileError(f"{model} at {world}: no measured iterations; raise --seconds")
        start_s = _lost(run.t_spawn, t_probe, opts.probe, stages.iteration_s)
        restart_s = _relaunch(opts, model, world, ckpt, stopped.iteration, stages.iteration_s,
                              logs, f"{model}-w{world}-restart")
        resize_from = resize_s = None
        smaller = [w for w in ckpts if w < world]
        if smaller:
            resize_from = smaller[-1]
            moved = work / f"{model}-w{resize_from}to{world}"
            shutil.rmtree(moved, ignore_errors=True)
            shutil.copytree(ckpts[resize_from], moved)
            resume_at = _checkpoint_iteration(moved)
            resize_s = _relaunch(opts, model, world, moved, resume_at, stages.iteration_s,
                                 logs, f"{model}-w{resize_from}to{world}")
        point = Point(model, world, 1.0 / stages.iteration_s, stages.data_s, stages.compute_s,
                      stages.comm_s, stages.iteration_s, start_s, restart_s, stop_s,
                      resize_from, resize_s)
        say(f"{model} x{world}: {point.iterations_per_s:.1f} it/s, start {start_s:.2f} s, "
            f"restart {restart_s:.2f} s"
            + (f", resize {resize_from}→{world} {resize_s:.2f} s" if resize_s is not None
               else ""))
        points.append(point)
    return points


def _relaunch(opts: ProfileOptions, model: str, world: int, ckpt: Path, from_iteration: int,
              iteration_s: float, logs: Path, tag: str) -> float:
    run = Launch(opts, model, world, ckpt, logs, tag)
    try:
        t_done, _ = run.until(_progress_at(from_iteration + opts.probe), opts.timeout_s)
        run.stop(opts.timeout_s)
    finally:
        run.kill()
    return _lost(run.t_spawn, t_done, opts.probe, iteration_s)


def _checkpoint_iteration(ckpt: Path) -> int:
    from services.trainer import checkpoint

    obj = checkpoint.load(str(ckpt))
    if obj is None:
        raise ProfileError(f"no checkpoint in {ckpt}")
    meta, _, _ = checkpoint.unpack(obj)
    return meta.iteration


# --- the whole profile -------------------------------------------------------------------------

def run_profile(opts: ProfileOptions, say: Callable[[str], None] = lambda _: None
                ) -> list[Point]:
    opts.validate()
    opts.out.mkdir(parents=True, exist_ok=True)
    points: list[Point] = []
    with _workdir() as work:
        for repeat in range(opts.repeats):
            for model in opts.models:
                say(f"repeat {repeat + 1}/{opts.repeats}: {model}")
                points += measure(opts, model, work, say)
    write_profile(opts, points)
    return points


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="loom-profile-") as tmp:
        yield Path(tmp)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarise(points: Sequence[Point]) -> dict[str, dict[int, dict[str, Any]]]:
    """Median per (workload, size) of every field, with the min and max of the measured ones."""
    groups: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        groups.setdefault((p.model, p.gpus), []).append(p)
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for (model, gpus), ps in groups.items():
        row: dict[str, Any] = {"repeats": len(ps), "resize_from": ps[0].resize_from}
        for name in ("iterations_per_s", "data_s", "compute_s", "comm_s", "iteration_s",
                     "start_s", "restart_s", "stop_s", "resize_s"):
            values = [getattr(p, name) for p in ps if getattr(p, name) is not None]
            if values:
                row[name] = _median(values)
                row[f"{name}_range"] = [min(values), max(values)]
        out.setdefault(model, {})[gpus] = row
    return out


def write_profile(opts: ProfileOptions, points: Sequence[Point]) -> None:
    table = summarise(points)
    tdir = opts.out / "throughputs"
    tdir.mkdir(parents=True, exist_ok=True)
    counts = gpu_counts(opts.max_gpus)
    for model, rows in table.items():
        cells = [f"{rows[g]['iterations_per_s']!r}" if g in rows else "" for g in counts]
        (tdir / f"{model}.csv").write_text(
            "global_batch_size," + ",".join(map(str, counts)) + "\n"
            + f"{opts.batch_size}," + ",".join(cells) + "\n")
    gavel = {opts.device: {f"('{model}', {g})": {"null": row["iterations_per_s"]}
                           for model, rows in table.items() for g, row in rows.items()}}
    _write_json(opts.out / "throughputs.json", gavel)
    stages = {model: {str(g): {k: row[k] for k in ("data_s", "compute_s", "comm_s",
                                                   "iteration_s")}
                      for g, row in rows.items()}
              for model, rows in table.items()}
    _write_json(opts.out / "stages.json", {"batch_size": opts.batch_size, "device": opts.device,
                                           "workloads": stages})
    overheads: dict[str, Any] = {"format": OVERHEADS_FORMAT, "workloads": {}}
    for model, rows in table.items():
        entry: dict[str, Any] = {
            "start_s": {str(g): row["start_s"] for g, row in rows.items()},
            "restart_s": {str(g): row["restart_s"] for g, row in rows.items()},
            "stop_s": {str(g): row["stop_s"] for g, row in rows.items()},
            "resize_s": {f"{row['resize_from']}->{g}": row["resize_s"]
                         for g, row in rows.items() if "resize_s" in row},
        }
        overheads["workloads"][model] = entry
    _write_json(opts.out / "overheads.json", overheads)
    _write_json(opts.out / "profile.json", {
        "options": {k: (str(v) if isinstance(v, Path) else v)
                    for k, v in asdict(opts).items() if k != "python"},
        "summary": {m: {str(g): row for g, row in rows.items()} for m, rows in table.items()},
        "points": [asdict(p) for p in points],
    })


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


# --- the command line --------------------------------------------------------------------------

def add_profile_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile", help="measure workloads with the real trainer (throughputs, stage times, "
                        "overheads)",
        description="Run bundled workloads briefly at 1, 2, 4, … processes (one per GPU where "
                    "there are GPUs) with the real trainer; write ElasticFlow- and Gavel-format "
                    "throughput tables, Muri stage times and measured restart/resize overheads "
                    "for `loom sim --profile OUT`.")
    p.add_argument("--models", required=True,
                   help=f"comma-separated workloads ({', '.join(FAMILIES)})")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--max-gpus", type=int, default=2, help="largest world size (default 2)")
    p.add_argument("--seconds", type=float, default=4.0,
                   help="training seconds per point after start-up (default 4)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (default 32)")
    p.add_argument("--repeats", type=int, default=1,
                   help="repeat every measurement; tables hold the median (default 1)")
    p.add_argument("--probe", type=int, default=10,
                   help="iterations a restart must finish to count as resumed (default 10)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--device-name", default="cpu",
                   help="the GPU type name in the tables (default cpu)")
    p.add_argument("--data", action="append", default=[], metavar="WORKLOAD=PATH",
                   help="train WORKLOAD on a real dataset (repeatable), e.g. cnn=~/cifar10")
    p.add_argument("--log-level", default="warning", help="log level (default warning)")


def cmd_profile(args: argparse.Namespace) -> int:
    data: dict[str, str] = {}
    for item in args.data:
        model, sep, path = item.partition("=")
        if not sep or not path:
            raise ValueError(f"--data {item!r}: use WORKLOAD=PATH")
        data[model] = path
    opts = ProfileOptions(
        models=tuple(m.strip() for m in args.models.split(",") if m.strip()), out=args.out,
        max_gpus=args.max_gpus, seconds=args.seconds, batch_size=args.batch_size,
        repeats=args.repeats, probe=args.probe, threads=args.threads,
        device=args.device_name, data=data)
    console = Console(stderr=True)
    try:
        run_profile(opts, lambda line: console.print(line, highlight=False))
    except ProfileError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 1
    table = Table(title=f"loom profile ({opts.repeats} repeat(s), median [min-max])")
    for col in ("workload", "GPUs", "it/s", "data ms", "compute ms", "comm ms", "start s",
                "restart s", "resize s", "stop s"):
        table.add_column(col)
    for model, rows in summarise_file(opts.out).items():
        for gpus, row in rows.items():
            table.add_row(model, str(gpus), _cell(row, "iterations_per_s", 1),
                          _cell(row, "data_s", 1000), _cell(row, "compute_s", 1000),
                          _cell(row, "comm_s", 1000), _cell(row, "start_s", 1),
                          _cell(row, "restart_s", 1), _cell(row, "resize_s", 1),
                          _cell(row, "stop_s", 1))
    Console().print(table)
    Console().print(f"wrote {opts.out}/throughputs/*.csv, throughputs.json, stages.json, "
                    f"overheads.json, profile.json")
    return 0


def summarise_file(out: Path) -> dict[str, dict[str, dict[str, Any]]]:
    summary: dict[str, dict[str, dict[str, Any]]] = json.loads(
        (out / "profile.json").read_text())["summary"]
    return summary


def _cell(row: dict[str, Any], key: str, scale: float) -> str:
    if key not in row:
        return "-"
    lo, hi = row[f"{key}_range"]
    if lo == hi:
        return f"{row[key] * scale:.2f}"
    return f"{row[key] * scale:.2f} [{lo * scale:.2f}-{hi * scale:.2f}]"
