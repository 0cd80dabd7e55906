"""The scheduler's job table: every job's record, and every transition a job makes.

All state changes of a job go through `JobTable.transition` (checked against the lifecycle's
table and published) or, when a scheduler is rebuilt from the stream, `JobTable.restore`
(the same bookkeeping, from a transition already published).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from domain.compiled import mypyc_attr
from domain.progress import (
    CATCH_UP_CYCLES,
    RunProgress,
    attained_many,
    charge_many,
    iterations_left,
)
from policies.base import JobView
from schemas import subjects
from schemas.causes import Cause
from schemas.events import GpuSlots, JobTransition, JobTransitionV1, gpu_count
from schemas.job import TERMINAL_STATES, WAITING_STATES, JobSpec, JobState
from schemas.status import Status
from services.runtime.effects import Publish
from services.runtime.trusted import trusted
from services.scheduler.lifecycle import Transition, check

_RUNNING = JobState.RUNNING  # a global's lookup, not one through the enum's metaclass


@mypyc_attr(allow_interpreted_subclasses=True)  # copyable: forecasts fork the state
@dataclass(slots=True)
class JobRecord:
    spec: JobSpec
    admitted: int = 0  # admission order: ties between jobs resolve in this order
    state: JobState | None = None
    iterations_done: float = 0.0
    reported: float = 0.0  # progress at launch or as a node last reported it (a lost node's
    # jobs restart from here)
    run: RunProgress | None = None  # the estimate of its current run, while it runs
    group: tuple[str, ...] = ()  # jobs sharing its GPUs, itself included; () when alone
    attained_s: float = 0.0
    accounted_at: float = 0.0
    placement: GpuSlots = ()
    preemptions: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    status: Status | None = None
    last: Transition | None = None  # its latest transition (why it runs, since when); the
    # whole story is in the event log, not kept per job in memory
    launched_by: tuple[int, int] | None = None  # (term, cycle) of the plan of its current run
    unseen: int = 0  # heartbeats since then that should have listed its run and did not
    confirmed: bool = False  # its node has shown the current run (heartbeat, progress, end)
    hosts: tuple[str, ...] = ()  # every node it has been placed on, sorted: the only ones
    # whose word about it counts (kept for good, so a tuple: a quarter of a frozenset's size)
    synced: int = 0  # while it runs, the table's cycles charged to it (`JobTable.log_cycle`)
    started: int = 0  # while it runs, its place in `JobTable.running`'s order (a start count)

    def place(self, slots: GpuSlots) -> None:
        self.placement = slots
        hosts = self.hosts
        if any(n not in hosts for n, _ in slots):
            self.hosts = tuple(sorted({*hosts, *(n for n, _ in slots)}))

    def unplace(self) -> None:
        """Off its GPUs (stopped, requeued, failed): no placement, group or run estimate."""
        self.placement, self.group, self.run = (), (), None

    def on_node(self, node: str) -> bool:
        """Whether its placement uses `node`."""
        return any(n == node for n, _ in self.placement)

    def account(self, now: float, lost_s: float) -> None:
        """Bring a running job's estimated progress and attained time up to `now`, as its
        node agent accounts it; `lost_s`: what the interruption costs."""
        run = self.run
        assert run is not None
        run.advance(now, lost_s)
        self.iterations_done = self.spec.iterations - run.remaining
        self.attained_s += now - self.accounted_at
        self.accounted_at = now

    def catch_up(self, times: Sequence[float], start: int) -> None:
        """`account` at each of the cycles `times[start:]`, in order (the same arithmetic)."""
        run = self.run
        assert run is not None
        run.charge(times, start, run.per_event_s)
        (attained,) = attained_many(((self.attained_s, self.accounted_at, start),), times)
        self.charged(attained, times[-1] if start < len(times) else self.accounted_at)

    def charged(self, attained: float, at: float) -> None:
        """Its run has been charged up to `at` (a cycle), and it has `attained` seconds."""
        assert self.run is not None
        self.iterations_done = self.spec.iterations - self.run.remaining
        self.attained_s, self.accounted_at = attained, at

    def view(self) -> JobView:
        if self.state is JobState.RUNNING:
            # While it runs, its latest transition is the one into its current run.
            since = self.last.at if self.last is not None else None
            return JobView.make(self.spec, True, self.iterations_done, self.attained_s,
                                self.preemptions, gpu_count(self.placement), since)
        return JobView.make(self.spec, False, self.iterations_done, self.attained_s,
                            self.preemptions, 0)


# A record's place in admission order (the sort key of running jobs, every cycle: C-level).
admission_order: Callable[[JobRecord], int] = attrgetter("admitted")


@dataclass(slots=True)
class _Ended:
    """A job's record once it has ended (finished, failed, rejected), packed: a record keeps
    its spec (about 1.7 kB as a model) for as long as the table lasts, and a million-job run
    would hold them all. The spec is kept as its JSON (about 200 bytes), the rest as is;
    nothing here changes again, since an ended job makes no more transitions."""

    spec_json: bytes
    admitted: int
    state: JobState
    iterations_done: float
    attained_s: float
    accounted_at: float
    placement: GpuSlots
    preemptions: int
    started_at: float | None
    ended_at: float | None
    status: Status | None
    last: Transition | None
    hosts: tuple[str, ...]

    @classmethod
    def pack(cls, rec: JobRecord) -> _Ended:
        assert rec.state is not None
        return cls(rec.spec.model_dump_json(exclude_defaults=True).encode(), rec.admitted,
                   rec.state, rec.iterations_done, rec.attained_s, rec.accounted_at,
                   rec.placement, rec.preemptions, rec.started_at, rec.ended_at, rec.status,
                   rec.last, rec.hosts)

    def unpack(self) -> JobRecord:
        """The record as it was when it ended (a copy: changing it changes nothing)."""
        return JobRecord(
            spec=JobSpec.model_validate_json(self.spec_json), admitted=self.admitted,
            state=self.state, iterations_done=self.iterations_done,
            reported=self.iterations_done, attained_s=self.attained_s,
            accounted_at=self.accounted_at, placement=self.placement,
            preemptions=self.preemptions, started_at=self.started_at, ended_at=self.ended_at,
            status=self.status, last=self.last, hosts=self.hosts)


class JobTable(Mapping[str, JobRecord]):
    """The records (by job id, in admission order), the running ones, the jobs an operator
    suspended, and each tenant's count of waiting jobs (for its quota).

    Every cycle charges each running job (`JobRecord.account`), lazily: the cycle is logged,
    and a running record is charged the cycles it has not been when it is next read through
    the table (`[]`, `get`), changed by it (`clear_running`), or synced (`sync`), or when the
    log reaches `CATCH_UP_CYCLES`. Same arithmetic, same order, so the same figures as an
    eager charge at every cycle; what is read of a record in `running` directly is its
    placement and identity, never its progress.
    """

    def __init__(self) -> None:
        self._records: dict[str, JobRecord | _Ended] = {}
        self._ended: list[str] = []  # jobs that ended since their records were last packed
        self.running: dict[str, JobRecord] = {}  # change it through the methods below
        self._moves: set[str] = set()  # jobs that started, stopped or moved since asked
        self._reported: set[str] = set()  # running jobs a node reported progress for, since
        # asked (a report replaces the estimate)
        # GPUs the running jobs hold, each counted once (`busy_gpus`): those of jobs alone,
        # by job and in all, and the jobs that share GPUs (whose GPUs need a set).
        self._alone: dict[str, int] = {}
        self._alone_gpus = 0
        self._sharing: dict[str, JobRecord] = {}
        self._resized: set[str] = set()  # running on other than their gang's GPU count
        self._cycles: list[float] = []  # times of cycles not yet charged to every running job
        self._logged = 0  # cycles logged in all (the log's end, as a count)
        self._starts = 0  # jobs put into `running` in all (`JobRecord.started`)
        self.held: set[str] = set()  # suspended by an operator: out of the policy's sight
        self._waiting: Counter[str] = Counter()  # queued or preempted jobs, by tenant

    def __getitem__(self, job_id: str) -> JobRecord:
        rec = self._records[job_id]
        if type(rec) is not JobRecord:
            return rec.unpack()  # type: ignore[union-attr]
        if rec.synced < self._logged:
            self.sync(rec)
        return rec

    def log_cycle(self, now: float) -> None:
        """A cycle at `now` charges every running job (see class docstring)."""
        if not self.running:
            return
        self._cycles.append(now)
        self._logged += 1
        if len(self._cycles) >= CATCH_UP_CYCLES:
            self.sync_many(self.running.values())
            self._cycles.clear()

    def sync(self, rec: JobRecord) -> None:
        """Charge a running job the cycles logged since it was last charged (none for a job
        not running). One job at a time (views read one by one): not through `sync_many`,
        whose batch set-up made a 2,560-GPU Tiresias run about a tenth slower."""
        behind = self._logged - rec.synced
        if behind > 0 and self.running.get(rec.spec.job_id) is rec:
            rec.catch_up(self._cycles, len(self._cycles) - behind)
        rec.synced = self._logged

    def sync_many(self, recs: Iterable[JobRecord]) -> None:
        """`sync` each of `recs`, the charges made as one batch (`charge_many`)."""
        times, logged, running = self._cycles, self._logged, self.running
        due: list[tuple[JobRecord, int]] = []
        for rec in recs:
            behind = logged - rec.synced
            if behind > 0 and running.get(rec.spec.job_id) is rec:
                due.append((rec, len(times) - behind))
            rec.synced = logged
        if not due:
            return
        charge_many([(rec.run, start) for rec, start in due if rec.run is not None], times)
        attained = attained_many([(rec.attained_s, rec.accounted_at, start)
                                  for rec, start in due], times)
        for (rec, _), seconds in zip(due, attained, strict=True):
            rec.charged(seconds, times[-1])

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._records

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def waiting(self, tenant: str) -> int:
        return self._waiting[tenant]

    def pack_ended(self) -> None:
        """Pack the records of the jobs that ended since the last call. Not at the transition
        itself: the handler that ends a job may still be writing its record."""
        for job_id in self._ended:
            rec = self._records[job_id]
            if type(rec) is JobRecord and rec.state is not None and rec.state.terminal:
                self._records[job_id] = _Ended.pack(rec)
        self._ended = []

    def add(self, spec: JobSpec, now: float, status: Status | None = None) -> JobRecord:
        """A new record (admitted, or refused with `status`), next in admission order."""
        rec = JobRecord(spec=spec, admitted=len(self._records), accounted_at=now,
                        status=status)
        self._records[spec.job_id] = rec
        return rec

    def set_running(self, rec: JobRecord) -> None:
        job_id = rec.spec.job_id
        held = self.running.get(job_id)
        if held is None:
            self._starts += 1
            rec.started = self._starts
        else:  # a job already running keeps its place, as the dict keeps it
            rec.started = held.started
        self.running[job_id] = rec
        rec.synced = self._logged  # no cycle before its start charges it
        self._moves.add(rec.spec.job_id)

    def in_running_order(self, job_ids: Iterable[str]) -> list[str]:
        """Those of `job_ids` that run, in `running`'s order, without reading the rest."""
        running = self.running
        return sorted((j for j in job_ids if j in running), key=lambda j: running[j].started)

    def clear_running(self, job_id: str) -> JobRecord:
        self._moves.add(job_id)
        self._uncount(job_id)
        self.sync(self.running[job_id])
        rec = self.running.pop(job_id)
        if not self.running:
            self._cycles.clear()  # every job was charged every cycle it saw
        return rec

    def placed(self, rec: JobRecord) -> None:
        """A running job was placed anew (launched or migrated), with its group."""
        job_id = rec.spec.job_id
        self._moves.add(job_id)
        self._uncount(job_id)
        gpus = gpu_count(rec.placement)
        if gpus != rec.spec.gpus:  # an elastic policy's doing
            self._resized.add(job_id)
        if rec.group:
            self._sharing[job_id] = rec
        else:
            self._alone[job_id] = gpus
            self._alone_gpus += gpus

    def _uncount(self, job_id: str) -> None:
        self._alone_gpus -= self._alone.pop(job_id, 0)
        self._sharing.pop(job_id, None)
        self._resized.discard(job_id)

    def irregular(self) -> frozenset[str]:
        """Running jobs a walk may not simply give back their GPUs: those sharing GPUs with
        others (a partner re-placed first takes them), and those holding other than their
        gang's GPU count (the walk places the gang's count)."""
        if not self._sharing and not self._resized:
            return frozenset()
        return frozenset(self._sharing.keys() | self._resized)

    def running_spec(self, job_id: str) -> JobSpec | None:
        """A running job's spec (None if it does not run), without charging it."""
        rec = self.running.get(job_id)
        return None if rec is None else rec.spec

    def running_left(self, job_id: str) -> tuple[JobSpec, float]:
        """A running job's spec and the seconds it has left, charged up to the last cycle, as
        its view would hold them (`JobView.remaining_s`), without making the view: a walk
        ranks many by remaining time."""
        rec = self.running[job_id]
        self.sync(rec)
        spec = rec.spec
        return spec, iterations_left(spec.iterations, rec.iterations_done) * spec.iteration_time_s

    def running_attained(self, job_id: str) -> tuple[JobSpec, float] | None:
        """A running job's spec and the seconds it has held GPUs, charged up to the last
        cycle, as its view would hold them (`JobView.attained_s`), without making the view;
        None for a job not running."""
        rec = self.running.get(job_id)
        if rec is None:
            return None
        self.sync(rec)
        return rec.spec, rec.attained_s

    def busy_gpus(self) -> int:
        """GPUs the running jobs hold, each counted once: only a co-located group's members
        share GPUs (a job alone has its own), so only theirs need a set."""
        shared = {(node, i) for rec in self._sharing.values()
                  for node, gpus in rec.placement for i in gpus}
        return self._alone_gpus + len(shared)

    def reported(self, job_id: str) -> None:
        """A node reported a running job's progress (it may set the estimate back)."""
        self._reported.add(job_id)

    def take_reported(self) -> frozenset[str]:
        """The running jobs reported on since the last call."""
        if not self._reported:
            return frozenset()
        reported, self._reported = frozenset(self._reported & self.running.keys()), set()
        return reported

    def take_moves(self) -> set[str]:
        """The jobs that started, stopped or moved since the last call (the placement state
        kept across cycles is updated with these)."""
        moves, self._moves = self._moves, set()
        return moves

    def pending_moves(self) -> frozenset[str]:
        """The moves `take_moves` would hand over, left where they are (a forecast copies
        the placement state, which is told of them at the next cycle)."""
        return frozenset(self._moves)

    def running_in_order(self) -> list[JobRecord]:
        return sorted(self.running.values(), key=admission_order)

    def in_admission_order(self, job_ids: Iterable[str]) -> list[str]:
        """These running jobs, in admission order."""
        running = self.running
        return [rec.spec.job_id for rec in sorted((running[j] for j in job_ids),
                                                  key=admission_order)]

    def transition(self, rec: JobRecord, state: JobState, cause: Cause, now: float, *,
                   with_spec: bool = False) -> Publish:
        """Move a job to `state` (a legal move, or this raises), and the event that says so."""
        check(rec.state, state, rec.spec.job_id)
        self._count_waiting(rec.spec.tenant, rec.state, state)
        rec.last = Transition(now, rec.state, state, cause)
        previous, rec.state = rec.state, state
        ended = state in TERMINAL_STATES
        if ended:
            self._ended.append(rec.spec.job_id)
        running = state is _RUNNING
        return Publish(subjects.JOB_TRANSITION, trusted(
            JobTransition,
            job_id=rec.spec.job_id, state=state, previous=previous, cause=cause.text,
            reason=cause,
            gpus=gpu_count(rec.placement) if running else 0,
            placement=rec.placement if running else (),
            iterations_done=rec.iterations_done,
            status=rec.status if ended else None,
            spec=rec.spec if with_spec else None))

    def restore(self, t: JobTransitionV1, at: float) -> bool:
        """Redo a published transition on the table (a scheduler rebuilt from the stream);
        False if it has nothing to restore (a job rejected before it had a valid spec)."""
        rec = self.get(t.job_id)  # records are packed by cycles, which a rebuild runs after
        if rec is None:
            if t.spec is None:
                return False
            rec = self.add(t.spec, at)
        if rec.state is JobState.RUNNING:
            rec.attained_s += at - rec.accounted_at
        rec.accounted_at = at
        cause = t.why()
        self._count_waiting(rec.spec.tenant, rec.state, t.state)
        rec.last = Transition(at, rec.state, t.state, cause)
        rec.state = t.state
        rec.iterations_done = t.iterations_done
        if t.state is JobState.RUNNING:
            rec.place(t.placement)
            if rec.started_at is None:
                rec.started_at = at
            self.held.discard(t.job_id)
        elif t.state in (JobState.PREEMPTED, JobState.FAILED):  # a finished job keeps its
            rec.placement = ()  # GPUs' record, as the live core does
        if t.state is JobState.PREEMPTED:
            rec.preemptions += 1
            if cause.kind == "suspended":
                self.held.add(t.job_id)
        if t.state.terminal:
            rec.status, rec.ended_at = t.status, at
            self.held.discard(t.job_id)
            self._ended.append(t.job_id)
        return True

    def check_host(self, job_id: str, node: str) -> None:
        """A node speaks only of jobs placed on it (now or before): anything else is forged
        or misrouted, and raises (the shell dead-letters the event with this reason)."""
        rec = self._records.get(job_id)  # a packed record keeps its hosts too
        if rec is None:
            raise ValueError(f"node {node} reports on job {job_id!r}, which the scheduler does "
                             "not know")
        if node not in rec.hosts:
            where = ", ".join(sorted(rec.hosts)) or "no node yet"
            raise ValueError(f"node {node} reports on job {job_id!r}, which was never placed "
                             f"there (placed on: {where})")

    def _count_waiting(self, tenant: str, before: JobState | None, after: JobState) -> None:
        if before in WAITING_STATES:
            self._waiting[tenant] -= 1
        if after in WAITING_STATES:
            self._waiting[tenant] += 1
