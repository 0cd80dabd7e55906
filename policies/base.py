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

    `ids`, `reported`, `irregular`, `spec_of`, `left_of` and `attained_of` are read without
    making views: which jobs run, which of them a node reported progress for since the
    previous cycle (a report replaces the estimate, so it may set a job back), which of them a
    walk may not simply give back their GPUs (`JobTable.irregular`), a running job's spec
    (None for a job not running), and its spec with the seconds it has left, or with the
    seconds it has held GPUs, as its view would hold them (`JobView.remaining_s`,
    `JobView.attained_s`; None for a job not running): all a walk needs of a running job it
    does not rank by its view.
    Read it while the cycle plans; the scheduler closes it after."""

    __slots__ = ("_make", "_order", "_views", "attained_of", "ids", "irregular", "left_of",
                 "reported", "spec_of")

    def __init__(self, ids: Collection[str], make: Callable[[], tuple[JobView, ...]],
                 reported: Collection[str] = (),
                 order: Callable[[Iterable[str]], list[str]] | None = None,
                 irregular: Collection[str] = (),
                 spec_of: Callable[[str], JobSpec | None] | None = None,
                 left_of: Callable[[str], tuple[JobSpec, float]] | None = None,
                 attained_of: Callable[[str], tuple[JobSpec, float] | None] | None = None,
                 ) -> None:
        self.ids = ids
        self.reported = reported
        self.irregular = irregular
        self.spec_of = spec_of
        self.left_of = left_of
        self.attained_of = attained_of
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


def running_attained_of(snap: Snapshot) -> Callable[[str], tuple[JobSpec, float] | None] | None:
    """`RunningJobs.attained_of` where the snapshot's running jobs give it."""
    running = snap.running
    return running.attained_of if isinstance(running, RunningJobs) else None


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
