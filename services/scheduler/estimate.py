"""A run's progress estimate from its launch: one function, so the scheduler's estimate of a
live run and the start-time forecaster's estimate of a run it imagines are the same
arithmetic (and, in a simulation, the node agent's too: `domain.progress`)."""

from __future__ import annotations

from collections.abc import Sequence

from domain.overhead import OverheadModel, job_rates, progress_segments
from domain.progress import RunProgress, seconds_to_finish
from schemas.events import GpuSlots, gpu_count
from schemas.job import JobSpec
from schemas.throughputs import ThroughputTable


def launch_progress(spec: JobSpec, iterations_done: float, slots: GpuSlots,
                    members: Sequence[JobSpec], gpu_type: str | None, model: OverheadModel,
                    profile: ThroughputTable | None, adaptive_batch: bool,
                    now: float) -> RunProgress:
    """The estimate of a run launched at `now` on `slots`, sharing them with `members`
    (the co-located group's specs, itself included; empty when alone), as its node agent
    will run it: its restart overhead first, then its (interleaved) iteration time."""
    size = gpu_count(slots)
    iteration_s, per_event_s = job_rates(spec, members, model, gpu_type, profile, size)
    return RunProgress(
        total=spec.iterations, remaining=spec.iterations - iterations_done,
        at=now, ready_at=now + model.restart(spec, size), iteration_s=iteration_s,
        per_event_s=per_event_s,
        segments=progress_segments(spec, slots, adaptive_batch, iterations_done))


def due_at(run: RunProgress, reported: float) -> float:
    """When a run's node agent expects it done, as the node computes it: from the launch
    (`reported`: the progress it launched with) for a run that no cycle interrupts, from the
    last cycle that charged it otherwise. The same value the scheduler's estimate reaches
    step by step, but not rounded step by step, so runs the node finishes at one instant
    finish at one instant here too."""
    if run.per_event_s:
        return run.finish_at(run.at)
    left = run.total - reported
    left = left if left > 0.0 else 0.0
    if run.segments is not None:
        return run.ready_at + seconds_to_finish(left, run.total, run.segments)
    return run.ready_at + left * run.iteration_s
