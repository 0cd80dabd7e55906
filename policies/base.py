"""The policy interface: a frozen snapshot in, a plan out.

A policy sees the cluster and every active job as immutable `JobView`s, walks them in its own
order and reserves GPUs through a `Fitter` (the placer's feasibility check for this cycle), so
what it plans is always placeable. It answers for every job it leaves waiting with a `Status`.

Policies are deterministic objects. The few that keep bookkeeping across cycles (Tiresias'
queue positions) keep it in the instance and change it only inside `plan`, so the same sequence
of snapshots always yields the same plans.
"""

from __future__ import annotations

import abc
import heapq
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, overload

from numpy.typing import ArrayLike

from domain.overhead import OverheadModel
from domain.placement import Scheme
from domain.progress import iterations_left
from schemas.cluster import ClusterSpec
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.status import Status, StatusCode
from schemas.throughputs import ThroughputTable

Replan = Literal["event", "round", "slot"]
_new_tuple = tuple.__new__


class JobView(NamedTuple):
    """One active job as a policy sees it at the snapshot's time (immutable).

    A NamedTuple because the scheduler builds one per running job per cycle; derived
    quantities are computed once, by `make`, since policies read them many times.
    """

    spec: JobSpec
    job_id: str
    gpus: int
    running: bool
    iterations_done: float
    remaining_iterations: float
    remaining_s: float  # at the trace's iteration time
    attained_s: float  # seconds it has held GPUs (Tiresias' "executed time")
    preemptions: int
    allocated: int  # GPUs it holds now (an elastic job may hold other than `gpus`); 0 waiting
    # When its current run began (started, resumed or moved), which is when it last restored
    # a checkpoint: the scheduler hears of no periodic checkpoints. None while it waits.
    run_since: float | None = None

    @classmethod
    def make(cls, spec: JobSpec, running: bool, iterations_done: float, attained_s: float,
             preemptions: int = 0, allocated: int | None = None,
             run_since: float | None = None) -> JobView:
        remaining = iterations_left(spec.iterations, iterations_done)
        held = (spec.gpus if running else 0) if allocated is None else allocated
        # tuple.__new__ rather than cls(...): a third of the cost, and this runs per running
        # job per cycle.
        return _new_tuple(cls, (spec, spec.job_id, spec.gpus, running, iterations_done,
                                remaining, remaining * spec.iteration_time_s, attained_s,
                                preemptions, held, run_since if running else None))

    @property
    def attained_gpu_s(self) -> float:
        return self.attained_s * self.gpus


class RunningJobs(Sequence[JobView]):
    """A snapshot's running jobs in admission order, their views made when first read: a cycle
    whose policy reads none of them (an in-place cycle of a policy that keeps its running
    jobs' ranks itself) does not pay for a view of every running job.

    `ids`, `reported`, `irregular`, `spec_of` and `left_of` are read without making views:
    which jobs run, which of them a node reported progress for since the previous cycle (a
    report replaces the estimate, so it may set a job back), which of them a walk may not
    simply give back their GPUs (`JobTable.irregular`), a running job's spec (None for a job
    not running), and its spec with the seconds it has left as its view would hold them
    (`JobView.remaining_s`), all a walk needs of a running job it does not rank by its view.
    Read it while the cycle plans; the scheduler closes it after."""

    __slots__ = ("_make", "_order", "_views", "ids", "irregular", "left_of", "reported",
                 "spec_of")

    def __init__(self, ids: Collection[str], make: Callable[[], tuple[JobView, ...]],
                 reported: Collection[str] = (),
                 order: Callable[[Iterable[str]], list[str]] | None = None,
                 irregular: Collection[str] = (),
                 spec_of: Callable[[str], JobSpec | None] | None = None,
                 left_of: Callable[[str], tuple[JobSpec, float]] | None = None) -> None:
        self.ids = ids
        self.reported = reported
        self.irregular = irregular
        self.spec_of = spec_of
        self.left_of = left_of
        self._make: Callable[[], tuple[JobView, ...]] | None = make
        self._order = order
        self._views: tuple[JobView, ...] | None = None

    def in_order(self, ids: Iterable[str]) -> list[str]:
        """Some of these jobs, in admission order (the order of the views)."""
        if self._order is None:
            wanted = set(ids)
            return [v.job_id for v in self.views() if v.job_id in wanted]
        return self._order(ids)

    def views(self) -> tuple[JobView, ...]:
        if self._views is None:
            if self._make is None:
                raise RuntimeError("a snapshot's running jobs were read after its cycle")
            self._views = self._make()
        return self._views

    def close(self) -> None:
        """The cycle is over: its running jobs can no longer be read if they were not."""
        self._make = None

    def __deepcopy__(self, memo: dict[int, Any]) -> RunningJobs:
        return self  # read only: a copied policy may keep a snapshot's jobs it cached

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> JobView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[JobView]: ...
    def __getitem__(self, i: int | slice) -> JobView | Sequence[JobView]:
        return self.views()[i]

    def __iter__(self) -> Iterator[JobView]:
        return iter(self.views())


def running_left_of(snap: Snapshot) -> Callable[[str], tuple[JobSpec, float]] | None:
    """A running job's spec and the seconds it has left (`JobView.remaining_s`), without its
    view (`RunningJobs.left_of`); None where the snapshot's running jobs do not give them."""
    running = snap.running
    return running.left_of if isinstance(running, RunningJobs) else None


def running_specs(snap: Snapshot) -> Callable[[str], JobSpec | None] | None:
    """`RunningJobs.spec_of` where the snapshot's running jobs give specs without views."""
    running = snap.running
    return running.spec_of if isinstance(running, RunningJobs) else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    cluster: ClusterSpec
    jobs: Mapping[str, JobView]  # every active (waiting or running) job
    running: Sequence[JobView]  # in admission order (a tuple, or `RunningJobs`)
    # Every running job stays on its GPUs this cycle (the policy said so: `running_stays`); the
    # placement already has them there, and the policy places waiting jobs only.
    in_place: bool = False


class Fitter(Protocol):
    """The placer's reservation state for one cycle (see domain.placement)."""

    free_gpus: int
    monotone: bool
    # Whether a gang fits or not by its size alone, whichever waiting job it is: then a size
    # that did not fit does not fit again this cycle (a cycle only takes GPUs), and a walk
    # skips the other waiting jobs of that size. A fitter with per-job rules (quotas) is not.
    fails_by_size: bool

    @property
    def scheme(self) -> Scheme:
        """The placement scheme (`domain.placement.SCHEMES`)."""
        ...

    def try_place(self, job_id: str, gpus: int, gpu_type: str | None = None,
                  within: Collection[str] | None = None) -> GpuSlots | None:
        """Reserve a gang of `gpus` (of `gpu_type`; only on the nodes `within`), or None."""
        ...

    def free_of(self, gpu_type: str) -> int: ...

    @property
    def counts_decide(self) -> bool:
        """Whether a gang fits exactly when as many GPUs are free this cycle, whichever GPUs
        running jobs hold (`CyclePlacement.counts_decide`): a walk then finds which jobs it
        places by counting, and lets the others go before it places any (`let_go`)."""
        ...

    def let_go(self, staying: Mapping[str, int]) -> dict[str, GpuSlots]:
        """Where counts decide, once a walk knows which running jobs it re-places (`staying`,
        with their GPU counts): those get their own GPUs back at once where they can, and
        every other one the walk would have re-placed gives its GPUs up to it
        (`CyclePlacement.let_go`)."""
        ...

    @property
    def idle_gpus(self) -> int:
        """Where counts decide, in a cycle opened in full: the GPUs no running job holds."""
        ...

    def stay_but(self, running: Collection[str], given_up: AbstractSet[str]) -> bool:
        """Where counts decide, before a walk opened in full places anything: every running
        job keeps its GPUs as it runs but `given_up`, which stop; the cycle then goes on in
        place. False, with nothing done, where a walk might not leave that state
        (`CyclePlacement.stay_but`)."""
        ...

    def explain(self, gpus: int) -> str: ...

    def blocked_displacing(self, gpus: int, victims: Iterable[str]) -> bool:
        """In a cycle opened in place: whether a full walk would certainly block a gang of
        `gpus` even where it may displace the running jobs `victims`, and keep them all
        (False where unsure; `CyclePlacement.blocked_displacing`)."""
        ...

    def keep_ahead(self, job_ids: Collection[str]) -> dict[str, GpuSlots] | None:
        """At the start of a walk opened in full: give these running jobs back their own
        GPUs, as the walk would if it re-placed them before anything else; None, with
        nothing done, where it might not (`CyclePlacement.keep_ahead`)."""
        ...

    def keep_all_but(self, running: Collection[str], walked: AbstractSet[str]
                     ) -> dict[str, GpuSlots] | None:
        """`keep_ahead` for the `running` jobs but `walked`, at the cost of the walked ones
        (`CyclePlacement.keep_all_but`)."""
        ...

    def stay_all_but(self, running: Collection[str], walked: AbstractSet[str]) -> bool:
        """`keep_all_but` for a plan that lists only what it walks (`Plan.stay`): the others
        stay, unlisted; False, with nothing done, where it would refuse
        (`CyclePlacement.stay_all_but`)."""
        ...

    def keep_in_turn(self, job_ids: Sequence[str], gpus: Sequence[int], below: int,
                     start: int = 0) -> list[GpuSlots | None]:
        """Running jobs a walk reaches one after another (`job_ids[start:]`), each given back
        its own GPUs as `try_place(job_id, gpus)` would, or passed over (None) where it asks
        for `below` GPUs or more, or more than are free; stops at the first it cannot decide
        so, left as `try_place` would leave it before searching, for the walk to place it.
        One entry per job decided (`CyclePlacement.keep_in_turn`)."""
        ...


@dataclass
class Plan:
    """Which jobs run where after this cycle, and why the others wait."""

    # In priority order, but for running jobs a walk kept ahead of all (`greedy_fill`'s
    # `kept`): first, in the order they were kept.
    run: dict[str, GpuSlots] = field(default_factory=dict)
    # How many of `run` come first as kept where they run (nothing to do for them).
    kept: int = 0
    # Jobs that share GPUs (all members, sorted), for each member; jobs alone are absent.
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    blocked: dict[str, Status] = field(default_factory=dict)  # examined, did not fit
    # Waiting jobs the policy refuses for good (admission control), with the reason.
    declined: dict[str, str] = field(default_factory=dict)
    wakeup_at: float | None = None  # re-plan then even if nothing arrives or finishes
    # Where the walk ended, to explain jobs it never reached (see `status_for_waiting`).
    free_gpus: int = 0
    unfit_from: int | None = None  # with a monotone fitter: no gang this large fits
    fragmented: str = ""  # the fitter's explanation for `unfit_from`
    # Sizes no waiting job could take this cycle (a fitter that fails by size alone), with the
    # fitter's explanation: later waiting jobs of those sizes were not tried.
    unfit_sizes: dict[int, str] = field(default_factory=dict)
    # Every running job stays where it is (an in-place cycle) but those `preempted`; `run`
    # then lists the jobs that start, and any running job a walk re-placed (where it runs,
    # or elsewhere: it moves).
    stay: bool = False
    preempted: set[str] = field(default_factory=set)

    def stopped(self, running: Iterable[str]) -> list[str]:
        """The `running` jobs this plan preempts, in their order."""
        if self.stay:
            gone = self.preempted
            return [j for j in running if j in gone] if gone else []
        return [j for j in running if j not in self.run]


class Policy(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    placement: ClassVar[Scheme] = "consolidated"
    replan: ClassVar[Replan] = "event"
    # The scheduler lets goodput-profiled jobs pick their batch size (Pollux co-adaptation).
    adapts_batch_size: ClassVar[bool] = False
    # Whether `plan_in_place` may answer (the scheduler asks it only then).
    tries_in_place: ClassVar[bool] = False
    # Whether the policy chooses each job's nodes itself (`try_place(within=)`): the scheduler
    # then never trades two gangs' nodes to spare a running job a move (`domain.keep_places`).
    chooses_nodes: ClassVar[bool] = False
    # The empirical job-size sample a policy ranks by, by name (Tiresias' "yarn-gput1000");
    # whoever makes the policy loads it (`traces.distributions`) and passes it to `configure`.
    size_distribution: ClassVar[str | None] = None

    def configure(self, *, seed: int, round_s: float,  # noqa: B027 - optional hook
                  profile: ThroughputTable | None = None, overhead: OverheadModel | None = None,
                  job_sizes: ArrayLike | None = None) -> None:
        """The run's seed, round length, throughput profile, overhead model and the job-size
        sample named by `size_distribution`, for policies that use them."""

    def admit(self, spec: JobSpec) -> str | None:
        """Why this policy can never run the job (it is then rejected), or None."""
        return None

    def job_added(self, job: JobView) -> None:  # noqa: B027 - optional hook
        """A job became active (admitted)."""

    def job_removed(self, job_id: str) -> None:  # noqa: B027 - optional hook
        """A job left for good (finished, failed)."""

    def job_requeued(self, job: JobView) -> None:  # noqa: B027 - optional hook
        """A running job was taken off between cycles (its node was lost) and waits again,
        as if this policy had preempted it; policies that keep a waiting index add it."""

    def job_running(self, job: JobView) -> None:  # noqa: B027 - optional hook
        """A job announced by `job_added` already runs: a scheduler rebuilt from the event
        log re-announces its running jobs so (services.scheduler.recovery)."""

    def running_stays(self, snap: Snapshot) -> bool:
        """Asked before a cycle: whether this policy's plan for `snap` is sure to leave every
        running job where it is. Then the cycle is planned in place (`Snapshot.in_place`) and
        costs what it places, not what runs."""
        return False

    def plan_in_place(self, snap: Snapshot, fit: Fitter) -> Plan | None:
        """Asked when `running_stays` said no (only if `tries_in_place`), with the placement
        opened in place: this cycle's plan, if this policy can show from an in-place walk
        that its full walk would have left every running job where it is (and then placed
        the same jobs on the same GPUs); else None, and nothing changed, so the cycle is
        planned in full. Then a cycle in which the jobs that overtake running ones fit
        beside them costs what it places too."""
        return None

    def solver_stats(self) -> Mapping[str, float | int] | None:
        """What this policy's solver did over the run (solves, seconds, answers it could not
        use), for the run's summary; None for a policy that solves nothing."""
        return None

    @abc.abstractmethod
    def plan(self, snap: Snapshot, fit: Fitter) -> Plan: ...

    @abc.abstractmethod
    def waiting_status(self, job_id: str) -> Status:
        """Why a waiting job is waiting, as of the last plan (queue position where ordered)."""


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


def status_for_waiting(job_id: str, gpus: int, plan: Plan | None, position: int | None,
                       who: str) -> Status:
    """Why a waiting job waits, from where the last cycle's walk ended."""
    if plan is not None and job_id in plan.blocked:
        code, reason = plan.blocked[job_id].code, plan.blocked[job_id].reason
    elif plan is not None and gpus in plan.unfit_sizes:
        code, reason = StatusCode.WAITING_FOR_CONSOLIDATED_GPUS, plan.unfit_sizes[gpus]
    elif plan is not None and plan.unfit_from is not None and gpus >= plan.unfit_from:
        code = StatusCode.WAITING_FOR_CONSOLIDATED_GPUS
        reason = f"needs {gpus} GPUs placed together; " + plan.fragmented.split("; ", 1)[-1]
    elif plan is not None and 0 < plan.free_gpus < gpus:
        code = StatusCode.WAITING_FOR_GPUS
        reason = f"needs {gpus} GPUs, {plan.free_gpus} free"
    else:
        code = StatusCode.WAITING_FOR_PRIORITY
        reason = "higher-priority jobs hold the GPUs it needs"
    return Status(code=code, reason=reason, decided_by=who, queue_position=position)
