"""`loom queues`: the queue layer of a live cluster, as Kueue shows a ClusterQueue's status.

For each queue, grouped by cohort: its nominal quota (per GPU type where its quotas are
typed), the GPUs its running jobs hold, what it borrows (beyond its nominal quota) and lends
(of its nominal quota, what the cohort's borrowers hold), its limits, running and waiting
jobs, its decayed usage and rank for borrowed GPUs, its reclaim mode, and why its jobs wait
(jobs per reason code, with the first such job's reason). The scheduler answers on
`loomctl.scheduler.queues` (docs/queues.md, "Operator view"); `--json` prints its answer.
Without a tenants file, or with one that has no `[queues.*]`, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from loom import live_args
from loom.status_view import until
from schemas.queue_status import QueueState, QueueStatus
from schemas.queues import ANY_TYPE


def add_command(sub: Any) -> None:
    q = sub.add_parser("queues", help="queues of a live cluster: quotas, use, borrowing, "
                                      "lending, waiting jobs and why",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("--json", action="store_true",
                   help="print the scheduler's queue status as JSON")
    q.add_argument("--cohort", action="append", metavar="COHORT",
                   help="only this cohort's queues (repeatable)")
    live_args.add_connection(q, default=live_args.default_url())


def cmd_queues(args: argparse.Namespace) -> int:
    from services.runtime.nats_auth import NatsAuth

    status = asyncio.run(fetch(args.nats_url, NatsAuth.from_args(args)))
    status = only_cohorts(status, args.cohort or ())
    if args.json:
        print(json.dumps(status.model_dump(mode="json"), indent=2))
        return 0
    Console(width=160).print(render(status))
    return 0


async def fetch(url: str, auth: Any = None) -> QueueStatus:
    """The queue status of the scheduler behind `url` (ValueError: none answers)."""
    from services.runtime.nats_live import with_connection

    return await with_connection(url, auth, ask)


async def ask(nc: Any) -> QueueStatus:
    import nats

    from schemas import subjects
    from schemas.codec import decode

    try:
        reply = await nc.request(subjects.QUEUES_REQUEST, b"", timeout=5)
    except nats.errors.NoRespondersError:
        try:  # a scheduler that predates `loom queues` still answers `loom status`
            await nc.request("loomctl.scheduler.state", b"", timeout=5)
        except nats.errors.NoRespondersError:
            raise ValueError("no scheduler is running on this NATS server") from None
        raise ValueError("the scheduler on this NATS server does not answer `loom queues`: "
                         "it predates it; restart it with this version of Loom") from None
    body = decode(reply.data).body
    if not isinstance(body, QueueStatus):
        raise ValueError(f"the scheduler answered `loom queues` with {type(body).__name__}")
    return body


def only_cohorts(status: QueueStatus, cohorts: Sequence[str]) -> QueueStatus:
    """The status narrowed to the queues of `cohorts` (all when empty)."""
    if not cohorts:
        return status
    known = {c.name for c in status.cohorts}
    unknown = [c for c in cohorts if c not in known]
    if unknown and status.configured:
        names = ", ".join(sorted(known)) or "none"
        raise ValueError(f"--cohort {unknown[0]!r}: no such cohort (cohorts: {names})")
    return status.model_copy(update={
        "cohorts": tuple(c for c in status.cohorts if c.name in cohorts),
        "queues": tuple(q for q in status.queues if q.cohort in cohorts)})


def not_configured(status: QueueStatus) -> str:
    if status.tenants_file:
        return ("No queues are configured: the scheduler's tenants file has no [queues.*] "
                "(docs/queues.md).")
    return ("No queues are configured: the scheduler runs without a tenants file "
            "(loom serve scheduler --tenants FILE, or loom up --tenants FILE; docs/queues.md).")


def render(status: QueueStatus) -> RenderableType:
    """Tables of queues, one per cohort (queues in no cohort last), and jobs outside them."""
    if not status.configured:
        return Text(not_configured(status))
    parts: list[RenderableType] = [Text(
        f"Queues · cycle {status.cycle} · t={status.at:,.0f} s", style="bold")]
    for cohort, half_life in [(c.name, c.half_life_s) for c in status.cohorts] + [(None, 0.0)]:
        rows = [q for q in status.queues if q.cohort == cohort]
        if rows:
            parts.append(queue_table(rows, cohort, half_life))
    out = status.unqueued
    if out is not None and (out.running_jobs or out.pending_jobs):
        parts.append(Text(f"Tenants in no queue: {out.running_jobs} running jobs on "
                          f"{out.used_gpus} GPUs, {out.pending_jobs} waiting."))
    return Group(*parts)


COLUMNS = ("queue", "GPU type", "nominal", "used", "borrowed", "lent", "limits b/l",
           "running", "pending", "usage GPU·h", "w · prio · rank", "reclaim", "waiting")
RIGHT = {"nominal", "used", "borrowed", "lent", "limits b/l", "running", "pending",
         "usage GPU·h", "w · prio · rank"}


def queue_table(rows: Sequence[QueueState], cohort: str | None, half_life_s: float) -> Table:
    nominal = sum(q.nominal for r in rows for q in r.quotas)
    used = sum(r.used for r in rows)
    borrowed = sum(q.borrowed for r in rows for q in r.quotas)
    title = (f"cohort {cohort} · half-life {span(half_life_s)} · {nominal} GPUs nominal · "
             f"{used} used · {borrowed} borrowed" if cohort is not None
             else f"queues in no cohort · {nominal} GPUs nominal · {used} used")
    reasons = [f"{r.name}: {w.code.value} ({_jobs(w.jobs)}; first {w.job_id}): {w.reason}"
               for r in rows for w in r.waiting]
    table = Table(title=title, title_justify="left", caption_justify="left",
                  caption=Text("\n".join(reasons)) if reasons else None)
    for col in COLUMNS:
        table.add_column(col, justify="right" if col in RIGHT else "left")
    for r in rows:
        for i, q in enumerate(r.quotas):
            lend = "all" if q.lending_limit is None else str(q.lending_limit)
            borrow = "∞" if q.borrowing_limit is None else f"+{q.borrowing_limit}"
            limits = f"{borrow} / {lend}" if r.cohort is not None else "-"
            head = [r.name if i == 0 else "", "any" if q.gpu_type == ANY_TYPE else q.gpu_type,
                    str(q.nominal), str(q.used), str(q.borrowed), str(q.lent), limits]
            if i == 0:
                rank = "-" if r.rank is None else str(r.rank)
                waiting = ", ".join(f"{w.code.value} {w.jobs}" for w in r.waiting)
                tail = [str(r.running_jobs), f"{r.pending_jobs} ({r.pending_gpus} GPUs)",
                        f"{r.usage_gpu_s / 3600:,.1f}", f"{r.weight:g} · {r.priority} · {rank}",
                        r.reclaim, waiting]
            else:
                tail = [""] * 6
            table.add_row(*head, *tail)
    return table


def span(seconds: float) -> str:
    """A half-life for people: 7d, 12h, 90m, 45 s (whole units where it has them)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return until(seconds)


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


COMMANDS = {"queues": cmd_queues}
