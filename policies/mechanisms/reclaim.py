"""Which borrowers' jobs a lender takes its quota back from (the victim order of reclaim).

A queue lends the idle part of its nominal quota to its cohort; when its own jobs wait within
that quota, it takes the GPUs back by preempting jobs of queues that hold more than their
nominal quota (Kueue's `reclaimWithinCohort`). Victims are chosen so:

1. Only jobs of queues above their nominal quota, and only while that queue is still above it
   (as Kueue: a queue is not pushed below what it is owed to pay another's claim), allowed by
   the lender's `reclaim` rule: `any` borrower, `lower_priority` (the borrower's queue has a
   lower priority than the lender's), or `never`.
2. Only jobs that have run their queue's `min_runtime_s` since their run began (KAI-Scheduler's
   minimum runtime): a younger job is never reclaimed; the lender waits, and the scheduler
   re-plans when the first such job comes of age (`eligible_at`).
3. Among those, most recent checkpoint first, then least progress lost (GPU-seconds since that
   checkpoint), then job id. The scheduler hears of no periodic checkpoint, so a job's last
   checkpoint is taken to be the start of its current run, when it resumed from one.
4. Greedily in that order until the claim is covered, then, as Kueue does, back over the chosen
   in reverse, dropping any the claim can do without. If the claim cannot be covered, nobody is
   preempted: preempting part of what is needed starts nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from schemas.queues import QueueSpec


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running job of a queue in the lender's cohort, holding `gpus` of one resource."""

    job_id: str
    queue: str
    gpus: int
    run_since: float
    eligible_at: float  # run_since + its queue's min_runtime_s

    def order(self, now: float) -> tuple[float, float, str]:
        """Victim order: most recent checkpoint, least progress lost, job id."""
        return (-self.run_since, (now - self.run_since) * self.gpus, self.job_id)


def may_reclaim(lender: QueueSpec, borrower: QueueSpec) -> bool:
    """Whether `lender`'s reclaim rule lets it preempt `borrower`'s jobs."""
    if lender.reclaim == "any":
        return True
    if lender.reclaim == "lower_priority":
        return borrower.priority < lender.priority
    return False


@dataclass(frozen=True, slots=True)
class Reclaim:
    victims: tuple[Candidate, ...]  # empty when the claim cannot be covered
    freed: int  # quota the victims give back to the cohort's pool
    blocked_until: float | None  # the first protected job's coming of age, if one would help


def choose(deficit: int, candidates: Iterable[Candidate], now: float,
           used: Mapping[str, int], nominal: Mapping[str, int],
           pool_part: Callable[[str, int], int]) -> Reclaim:
    """Victims freeing at least `deficit` GPUs of the cohort's pool, or none.

    `used`/`nominal`: each queue's GPUs held and nominal quota of the resource; `pool_part(q,
    u)`: how much of the pool queue q uses when it holds u (its use beyond what it keeps for
    itself, see `policies.mechanisms.queues`)."""
    ready = sorted((c for c in candidates if c.eligible_at <= now), key=lambda c: c.order(now))
    waiting = [c.eligible_at for c in candidates if c.eligible_at > now]
    held = dict(used)
    chosen: list[Candidate] = []
    freed = 0
    for c in ready:
        if freed >= deficit:
            break
        u = held[c.queue]
        if u <= nominal[c.queue]:
            continue  # no longer borrowing: what it holds now it is owed
        gain = pool_part(c.queue, u) - pool_part(c.queue, u - c.gpus)
        held[c.queue] = u - c.gpus
        chosen.append(c)
        freed += gain
    if freed < deficit:
        return Reclaim((), 0, min(waiting) if waiting else None)
    return Reclaim(_minimal(chosen, deficit, used, pool_part), freed, None)


def _minimal(chosen: Sequence[Candidate], deficit: int, used: Mapping[str, int],
             pool_part: Callable[[str, int], int]) -> tuple[Candidate, ...]:
    """Drop, last chosen first, each victim the claim can do without."""
    keep = list(chosen)
    for c in reversed(chosen):
        trial = [k for k in keep if k is not c]
        if _freed(trial, used, pool_part) >= deficit:
            keep = trial
    return tuple(keep)


def _freed(victims: Sequence[Candidate], used: Mapping[str, int],
           pool_part: Callable[[str, int], int]) -> int:
    out = 0
    taken: dict[str, int] = {}
    for c in victims:
        taken[c.queue] = taken.get(c.queue, 0) + c.gpus
    for q, n in taken.items():
        out += pool_part(q, used[q]) - pool_part(q, used[q] - n)
    return out
