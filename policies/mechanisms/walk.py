"""The walk: place jobs from ranked streams, all-or-nothing, in merged key order.

Every ordered policy ranks its jobs into streams (one per GPU count where that lets a walk skip
sizes that no longer fit) and hands them here with the cycle's `Fitter`. The walk reserves GPUs
job by job, records why a job that does not fit waits, and returns the `Plan`. Runs of running
jobs between two waiting ones go to the fitter in one call (`Fitter.keep_in_turn`), and a walk
whose placements counts alone decide (`Fitter.counts_decide`) counts instead of placing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from policies.base import Fitter, JobView, Plan
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.status import Status, StatusCode

__all__ = ["Ranked", "Stream", "any_type", "greedy_fill", "merge_heads", "place_counted",
           "place_runnable", "typed_fits"]

Ranked = tuple[Any, str]  # (sort key, job id): lower key runs first
Stream = tuple[int | None, Iterator[Ranked]]  # (GPU count of every job in it, or None; items)


def greedy_fill(streams: Iterable[Stream], jobs: Mapping[str, JobView], fit: Fitter,
                decided_by: str, kept: Mapping[str, GpuSlots] | None = None,
                running_spec: Callable[[str], JobSpec | None] | None = None) -> Plan:
    """Place jobs in merged key order, all-or-nothing, skipping those that do not fit;
    after `kept`, running jobs already given back their GPUs (`Fitter.keep_ahead`) that
    rank ahead of every job in the streams. `running_spec` (`RunningJobs.spec_of`): a
    running job's spec, so the walk need not make the view of a job of a mixed stream that
    runs.

    This is the loop of the Tiresias and Muri simulators (no head-of-line blocking). Each
    stream is already sorted; a stream whose jobs all need the same GPU count is dropped as
    soon as that count cannot fit (a monotone fitter guarantees no larger gang fits either),
    so a cycle costs O(placed · log streams), not O(queue length). Where counts alone decide
    what fits (`Fitter.counts_decide`), the walk is counted first (`_fill_counted`).
    """
    plan = Plan(run=dict(kept), kept=len(kept)) if kept else Plan()
    sources: list[Stream] = list(streams)
    if fit.counts_decide:
        _fill_counted(plan, sources, jobs, fit, decided_by, running_spec)
        return plan
    heads = merge_heads(sources)
    smallest_unfit = 1 << 30
    unfit = plan.unfit_sizes if fit.fails_by_size else None
    while heads and fit.free_gpus > 0:
        limit = min(smallest_unfit, fit.free_gpus + 1)
        key, job_id, i = heapq.heappop(heads)
        size, items = sources[i]
        if _dropped(size, limit, unfit):
            continue  # nothing in this stream can fit any more
        if size is None and running_spec is not None:
            smallest_unfit, odd = _keep_in_turn(plan, (key, job_id), i, sources, heads, fit,
                                                running_spec, smallest_unfit, limit, unfit,
                                                decided_by)
            if odd is None:
                continue
            job_id, limit = odd, min(smallest_unfit, fit.free_gpus + 1)
        spec, running = _spec_of(job_id, size, jobs, running_spec)
        g = size if size is not None else spec.gpus
        if g < limit and not (unfit and g in unfit and not running):
            smallest_unfit = _place(plan, fit, job_id, spec, g, running, smallest_unfit, unfit,
                                    decided_by)
        nxt = next(items, None)
        if nxt is not None:
            heapq.heappush(heads, (nxt[0], nxt[1], i))
    plan.free_gpus = fit.free_gpus
    return plan


def _place(plan: Plan, fit: Fitter, job_id: str, spec: JobSpec, g: int, running: bool,
           smallest_unfit: int, unfit: dict[int, str] | None, decided_by: str) -> int:
    """One step of `greedy_fill`'s walk: the job placed (`g` GPUs), or why not; the smallest
    gang size known not to fit after it."""
    slots = (fit.try_place(job_id, g) if spec.throughputs is None  # most jobs
             else place_runnable(fit, spec, g))
    if slots is not None:
        plan.run[job_id] = slots
        return smallest_unfit
    reason = fit.explain(g)
    plan.blocked[job_id] = Status(code=StatusCode.WAITING_FOR_CONSOLIDATED_GPUS, reason=reason,
                                  decided_by=decided_by)
    if fit.monotone and g < smallest_unfit:
        smallest_unfit = g
        plan.unfit_from, plan.fragmented = g, reason
    # A waiting job free to use any GPU type failed at this size: so would any later waiting
    # one (a running job may still keep its own GPUs).
    if unfit is not None and not running and any_type(spec):
        unfit[g] = reason
    return smallest_unfit


def _dropped(size: int | None, limit: int, unfit: dict[int, str] | None) -> bool:
    """Whether a stream of gangs of `size` GPUs can place nothing more in this walk (sizes
    only get less likely to fit as it goes on)."""
    return size is not None and (size >= limit or bool(unfit and size in unfit))


def _keep_in_turn(plan: Plan, first: tuple[Any, str], i: int, sources: list[Stream],
                  heads: list[tuple[Any, str, int]], fit: Fitter,
                  running_spec: Callable[[str], JobSpec | None], smallest_unfit: int,
                  limit: int, unfit: dict[int, str] | None, decided_by: str
                  ) -> tuple[int, str | None]:
    """`greedy_fill`'s walk over the running jobs of mixed stream `i` that come one after
    another, `first` (just taken from the heads) first, before the next job of any stream
    that may still place one: those given back their own GPUs, as most are, are kept and
    those too wide for the walk now passed over, many at a time (`Fitter.keep_in_turn`);
    the others are placed one by one as any job. Returns the smallest gang size known not
    to fit, and a job of the stream to place next as any (a waiting one, or one placed
    type by type: the stream resumes after it), else None with the stream's next job, if
    any, back among the heads."""
    live = [(k, jid) for k, jid, s in heads if not _dropped(sources[s][0], limit, unfit)]
    stop = min(live) if live else None
    items = sources[i][1]
    ids: list[str] = []
    specs: list[JobSpec] = []
    item: tuple[Any, str] | None = first
    while item is not None and (stop is None or item < stop):
        spec = running_spec(item[1])
        if spec is None or (spec.throughputs is not None and not any_type(spec)):
            break  # a waiting job, or one placed type by type: the walk places it
        ids.append(item[1])
        specs.append(spec)
        item = next(items, None)
    gpus = [spec.gpus for spec in specs]
    at = 0
    while at < len(ids) and fit.free_gpus > 0:
        decided = fit.keep_in_turn(ids, gpus, smallest_unfit, at)
        for k, slots in enumerate(decided, at):
            if slots is not None:
                plan.run[ids[k]] = slots
        at += len(decided)
        if at < len(ids) and fit.free_gpus > 0:  # one it could not decide: placed as any
            if gpus[at] < min(smallest_unfit, fit.free_gpus + 1):
                smallest_unfit = _place(plan, fit, ids[at], specs[at], gpus[at], True,
                                        smallest_unfit, unfit, decided_by)
            at += 1
    if fit.free_gpus <= 0 or item is None:
        return smallest_unfit, None  # the walk is over, or the stream
    if stop is not None and item >= stop:  # its next job comes after another stream's
        heapq.heappush(heads, (item[0], item[1], i))
        return smallest_unfit, None
    return smallest_unfit, item[1]


def _spec_of(job_id: str, size: int | None, jobs: Mapping[str, JobView],
             running_spec: Callable[[str], JobSpec | None] | None) -> tuple[JobSpec, bool]:
    """A walked job's spec and whether it runs: from `running_spec` for a job of a mixed
    stream that runs (its view need not be made), else from its view."""
    spec = running_spec(job_id) if running_spec is not None and size is None else None
    if spec is not None:
        return spec, True
    job = jobs[job_id]
    return job.spec, job.running


def merge_heads(sources: list[Stream]) -> list[tuple[Any, str, int]]:
    """Each stream's first item and its stream's index, as a heap (a merge's start)."""
    heads = []
    for i, (_, items) in enumerate(sources):
        first = next(items, None)
        if first is not None:
            heads.append((first[0], first[1], i))
    heapq.heapify(heads)
    return heads


def _fill_counted(plan: Plan, sources: list[Stream], jobs: Mapping[str, JobView], fit: Fitter,
                  decided_by: str, running_spec: Callable[[str], JobSpec | None] | None
                  ) -> None:
    """`greedy_fill` where a gang fits exactly when as many GPUs are free: the same walk,
    first counted to find which jobs it places (each that reaches its turn with as many
    GPUs left); then the running jobs that stay get their GPUs back at once, those that do
    not give theirs up (`Fitter.let_go`), and the jobs that start are placed on the GPUs no
    staying job holds. They find room there: what they take adds up to no more than the
    GPUs idle or given up. So no running job moves to make room for one that starts."""
    free = fit.free_gpus
    heads = merge_heads(sources)
    placed: list[tuple[str, int, JobSpec]] = []  # in walk order
    staying: dict[str, int] = {}  # running jobs placed, with their GPU counts
    while heads and free > 0:
        _, job_id, i = heapq.heappop(heads)
        size, items = sources[i]
        if size is not None and size > free:
            continue  # nothing in this stream can fit any more
        spec, running = _spec_of(job_id, size, jobs, running_spec)
        g = size if size is not None else spec.gpus
        if g <= free and (spec.throughputs is None or typed_fits(fit, spec)):
            free -= g
            placed.append((job_id, g, spec))
            if running:
                staying[job_id] = g
        nxt = next(items, None)
        if nxt is not None:
            heapq.heappush(heads, (nxt[0], nxt[1], i))
    place_counted(plan, placed, fit, decided_by, fit.let_go(staying))


def place_counted(plan: Plan, placed: list[tuple[str, int, JobSpec]], fit: Fitter,
                  decided_by: str, kept: Mapping[str, GpuSlots]) -> None:
    """A counted walk's jobs (`placed`, in walk order) into `plan`: those `kept` where they
    run, the others placed now, on GPUs no staying job holds."""
    for job_id, g, spec in placed:
        slots = kept.get(job_id)
        if slots is None:  # a job that starts, or a running one whose GPUs it cannot keep
            slots = place_runnable(fit, spec, g)
        if slots is not None:
            plan.run[job_id] = slots
        else:  # only if the fitter broke `counts_decide`'s promise: the job waits, as walked
            plan.blocked[job_id] = Status(code=StatusCode.WAITING_FOR_CONSOLIDATED_GPUS,
                                          reason=fit.explain(g), decided_by=decided_by)
    plan.free_gpus = fit.free_gpus


def typed_fits(fit: Fitter, spec: JobSpec) -> bool:
    """Where counts decide (GPUs of one type), whether a job with a profile may run on them:
    `place_runnable` tries only the types its profile rates above 0."""
    return any_type(spec) or any(rate > 0 and fit.free_of(gpu_type) > 0
                                 for gpu_type, rate in (spec.throughputs or {}).items())


def any_type(spec: JobSpec) -> bool:
    """Whether a job may run on every GPU type (no profile rules one out with rate 0)."""
    return spec.throughputs is None or all(r > 0 for r in spec.throughputs.values())


def place_runnable(fit: Fitter, spec: JobSpec, gpus: int) -> GpuSlots | None:
    """Place a job anywhere it can run: a profile may rule out some GPU types (rate 0)."""
    if any_type(spec):
        return fit.try_place(spec.job_id, gpus)
    for gpu_type, rate in (spec.throughputs or {}).items():
        if rate > 0:
            slots = fit.try_place(spec.job_id, gpus, gpu_type)
            if slots is not None:
                return slots
    return None
