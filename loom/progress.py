"""Progress of a long simulation, and a warning before one likely to exhaust memory.

`RunProgress` is the simulation's progress callback: on a terminal a live bar (virtual time,
jobs finished of all, events per second, ETA), elsewhere one line every `interval_s` (a CI
log, a file), and nothing with `--quiet`. It sees only what the callback hands it, so the
simulation core is free to change how it runs.

`check_memory` estimates a run's peak memory from its jobs and nodes and refuses to start one
that would not fit the memory available (MemoryRisk, exit 2), unless told to go on.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from loom.runs import RunSpec, run_one
from loom.simulate import SimResult

Mode = Literal["bar", "lines", "off"]
# Off a terminal, a line this often (a little under 10 s: lines come between two reports of
# the simulation, which are well under a second apart).
INTERVAL_S = 9.5


def choose_mode(quiet: bool, stream: TextIO | None = None) -> Mode:
    """Off with --quiet, a bar on a terminal, lines otherwise."""
    if quiet:
        return "off"
    return "bar" if (stream or sys.stderr).isatty() else "lines"


def duration(seconds: float) -> str:
    """12 s, 3m05s, 2h07m."""
    if not math.isfinite(seconds):
        return "?"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True)
class Sample:
    wall: float
    finished: int
    events: int


class EventModel:
    """How many events a job costs: events ~ a x jobs arrived + b x jobs finished, fitted by
    least squares over the run so far (an arrival publishes its submission and admission; a
    finish its completion and the re-plans it starts). Where the two counts have moved
    together, so that a and b cannot be told apart, an arrival and a finish are taken to
    cost the same: the events so far over the arrivals and finishes so far. Measured on
    100,000-job traces they cost 3 and 6 events (FIFO) or 7.6 and 6 (SRTF), and the ETA at a
    tenth of those runs came within 10 % of their end."""

    def __init__(self) -> None:
        self.aa = self.af = self.ff = self.ae = self.fe = 0.0
        self.last = (0, 0, 0)  # arrived, finished, events

    def add(self, arrived: int, finished: int, events: int) -> None:
        a, f, e = float(arrived), float(finished), float(events)
        self.aa += a * a
        self.af += a * f
        self.ff += f * f
        self.ae += a * e
        self.fe += f * e
        self.last = (arrived, finished, events)

    def costs(self) -> tuple[float, float]:
        """(events per arrival, events per finish)."""
        arrived, finished, events = self.last
        det = self.aa * self.ff - self.af * self.af
        if det > 1e-3 * self.aa * self.ff:  # the counts moved apart enough to tell
            a = (self.ae * self.ff - self.fe * self.af) / det
            b = (self.fe * self.aa - self.ae * self.af) / det
            if a >= 0 and b >= 0:
                return a, b
        each = events / (arrived + finished) if arrived + finished else 0.0
        return each, each

    def remaining(self, total: int) -> float:
        """Events still to come before `total` jobs have arrived and finished."""
        arrived, finished, _ = self.last
        a, b = self.costs()
        return a * max(0, total - arrived) + b * max(0, total - finished)


class RunProgress:
    """A progress callback (`finished, total, virtual time, events, arrived`) that reports.

    ETA: the events still to come (`EventModel`: what jobs have cost so far, for the jobs
    still to arrive and to finish) at the rate of events of the last `window` of the run (a
    third of the time so far, at least 20 s). A simulation's cost is its events, and a
    backlog that drains after the last arrival finishes jobs faster than before, so this
    holds where the jobs' own rate does not.
    """

    def __init__(self, label: str, mode: Mode = "lines", *, interval_s: float | None = None,
                 stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, unit: str = "jobs") -> None:
        self.label = label
        self.unit = unit  # what `finished` counts: jobs of a simulation, messages of a replay
        self.mode = mode
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.stream = stream or sys.stderr
        self.clock = clock
        self.started = clock()
        self.last_line: float | None = None
        self.samples: deque[Sample] = deque()
        self.model = EventModel()
        self.lines = 0  # lines written (mode "lines")
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> RunProgress:
        self.started = self.clock()
        if self.mode == "bar":
            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn(f"{self.unit} · {{task.fields[detail]}}"),
                console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=None, detail="starting")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __call__(self, finished: int, total: int, now: float, events: int = 0,
                 arrived: int | None = None) -> None:
        wall = self.clock()
        self._remember(Sample(wall, finished, events))
        self.model.add(finished if arrived is None else max(arrived, finished), finished,
                       events)
        if self.mode == "off":
            return
        detail = self.detail(finished, total, now)
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=finished, total=total or None,
                             detail=detail)
        elif self.mode == "lines" and wall - (self.last_line or self.started) >= \
                self.interval_s:
            self.last_line = wall
            self.lines += 1
            unit = self.unit
            done = (f"{finished:,}/{total:,} {unit} ({100 * finished / total:.0f}%)"
                    if total > 0 else f"{finished:,} {unit}")
            self.stream.write(f"{self.label}: {done} · {detail}\n")
            self.stream.flush()

    def _remember(self, sample: Sample) -> None:
        self.samples.append(sample)
        window = max(20.0, (sample.wall - self.started) / 3)
        while len(self.samples) > 2 and self.samples[1].wall <= sample.wall - window:
            self.samples.popleft()

    def rates(self) -> tuple[float, float]:
        """(jobs, events) per wall second over the window; 0 until there is one."""
        first, last = self.samples[0], self.samples[-1]
        span = last.wall - first.wall
        if span <= 0:
            return 0.0, 0.0
        return (last.finished - first.finished) / span, (last.events - first.events) / span

    def eta(self, finished: int, total: int) -> float:
        """Seconds until every job is done (inf while there is nothing to go by)."""
        if total <= 0:  # a stream of unknown length
            return math.inf
        if finished >= total:
            return 0.0
        jobs_per_s, events_per_s = self.rates()
        if events_per_s > 0 and finished > 0:
            return self.model.remaining(total) / events_per_s
        if jobs_per_s > 0:  # no event counts: the jobs' own rate
            return (total - finished) / jobs_per_s
        return math.inf

    def detail(self, finished: int, total: int, now: float) -> str:
        _, events_per_s = self.rates()
        elapsed = self.clock() - self.started
        return (f"virtual t={now:,.0f} s · {events_per_s:,.0f} events/s · "
                f"ETA {duration(self.eta(finished, total))} · {duration(elapsed)} so far")


# Peak memory of a run: what Python and the modules take, plus a part per job (its spec, its
# packed record once it ends, its outcome) and a part per node (each node agent's state). On
# the high side of peak RSS measured on 2026-11-26 (docs/validation.md, issue 20): 3.3 kB a
# job for a trace given whole (trace2 x16, 1,024 GPUs: 385 MB), 2.0 kB streamed (261 MB),
# 3.5 kB through `loom sim` (itp/cluster04, 15,802 jobs: 140 MB), about 5 kB a node (trace2 on
# 100,000 GPUs: 145 MB).
BASE_BYTES = 150e6
PER_JOB_BYTES = 6e3
PER_NODE_BYTES = 10e3


def estimate_bytes(jobs: int, nodes: int) -> float:
    return BASE_BYTES + jobs * PER_JOB_BYTES + nodes * PER_NODE_BYTES


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """Memory available to a new process (Linux MemAvailable), or None if unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class MemoryRisk(ValueError):
    """A run likely to exhaust memory; the message says how much and the flag to go on."""


def check_memory(jobs: int, nodes: int, runs: int = 1, available: float | None = None,
                 flag: str = "--no-memory-check") -> float:
    """Refuse (MemoryRisk) a run whose estimate is over 80 % of the memory available;
    the estimate in bytes otherwise. `runs` in parallel count each."""
    need = runs * estimate_bytes(jobs, nodes)
    have = available_bytes() if available is None else available
    if have is not None and need > 0.8 * have:
        each = f" ({runs} runs at once)" if runs > 1 else ""
        raise MemoryRisk(
            f"this run would need about {need / 1e9:,.1f} GB of memory{each} for {jobs:,} "
            f"jobs on {nodes:,} nodes, and {have / 1e9:,.1f} GB is available: it would "
            f"likely exhaust it. Use a smaller trace or cluster, or pass "
            f"{flag} to run it anyway")
    return need


def run_reported(spec: RunSpec, *, quiet: bool = False, memory_check: bool = True
                 ) -> SimResult:
    """`run_one` for the CLI: the memory check first, then the run with its progress shown
    as `choose_mode` says."""
    cfg = spec.config()
    if memory_check and cfg.total_jobs:
        check_memory(cfg.total_jobs, len(cfg.cluster.nodes))
    with RunProgress(spec.policy, choose_mode(quiet)) as reporter:
        return run_one(spec, cfg=cfg, on_progress=reporter)
