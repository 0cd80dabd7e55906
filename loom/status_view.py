"""`loom status` on a busy cluster: which jobs to show (`--state`, `--tenant`), in what
order (`--sort`), how many (`--limit`), and the table they are shown in."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from schemas.job import JobState

STATES = tuple(s.value for s in JobState)
# Groups of states a person asks for by one name.
STATE_GROUPS: dict[str, tuple[str, ...]] = {
    "waiting": (JobState.QUEUED.value, JobState.PREEMPTED.value),
    "active": (JobState.QUEUED.value, JobState.PREEMPTED.value, JobState.RUNNING.value),
    "done": (JobState.FINISHED.value, JobState.FAILED.value, JobState.REJECTED.value),
}

Row = dict[str, Any]


def _progress(row: Row) -> float:
    return float(row["done"]) / row["iterations"] if row.get("iterations") else 0.0


def _position(row: Row) -> float:
    pos = row.get("queue_position")
    return float("inf") if pos is None else float(pos)


def _eta(row: Row) -> float:
    eta = row.get("eta")
    return float("inf") if eta is None else float(eta)


def _start(row: Row) -> float:
    start = row.get("forecast_start_s")  # absent from schedulers before forecasts
    return float("inf") if start is None else float(start)


def until(seconds: float) -> str:
    """How long until a time `seconds` away, for people: 45 s, 12m, 3h07m, 2d04h."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


# --sort key -> (row key, descending?); "submit" keeps the scheduler's order (submission).
SORTS: dict[str, tuple[Callable[[Row], Any], bool]] = {
    "submit": (lambda r: 0, False),
    "job": (lambda r: r["job_id"], False),
    "state": (lambda r: STATES.index(r["state"]) if r["state"] in STATES else len(STATES),
              False),
    "tenant": (lambda r: r["tenant"], False),
    "gpus": (lambda r: r["gpus"], True),
    "progress": (_progress, True),
    "eta": (_eta, False),
    "start": (_start, False),
    "queue": (_position, False),
}


def states_arg(text: str) -> tuple[str, ...]:
    """A `--state` value: states or groups, comma-separated."""
    chosen: list[str] = []
    for word in (w.strip().lower() for w in text.split(",")):
        if word in STATES:
            chosen.append(word)
        elif word in STATE_GROUPS:
            chosen += STATE_GROUPS[word]
        else:
            groups = ", ".join(f"{k} ({'/'.join(v)})" for k, v in STATE_GROUPS.items())
            raise argparse.ArgumentTypeError(
                f"{word!r} is not a state; use {', '.join(STATES)} or a group: {groups}")
    return tuple(dict.fromkeys(chosen))


def limit_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: show at least 1 job")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", type=states_arg, action="append", metavar="STATES",
                        help=f"only jobs in these states, comma-separated: "
                             f"{', '.join(STATES)}, or waiting, active, done (repeatable)")
    parser.add_argument("--tenant", action="append", metavar="TENANT",
                        help="only this tenant's jobs (repeatable, or comma-separated)")
    parser.add_argument("--sort", choices=tuple(SORTS), default="submit",
                        help="order of the rows: submit (the scheduler's, default), job, "
                             "state, tenant, gpus (most first), progress (most first), eta, "
                             "queue (position), start (forecast start)")
    parser.add_argument("--limit", type=limit_arg, metavar="N",
                        help="show at most N jobs (the table's title says how many matched)")


def select(jobs: Sequence[Row], states: Sequence[str] = (), tenants: Sequence[str] = (),
           sort: str = "submit", limit: int | None = None) -> tuple[list[Row], int]:
    """The rows to show, and how many matched before `limit`."""
    rows = [j for j in jobs if (not states or j["state"] in states)
            and (not tenants or j["tenant"] in tenants)]
    key, descending = SORTS[sort]
    if sort != "submit":
        rows.sort(key=key, reverse=descending)  # stable: ties keep submission order
    return rows[:limit] if limit is not None else rows, len(rows)


def filters(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The states and tenants `args` asks for (empty: all)."""
    states = tuple(dict.fromkeys(s for group in args.state or () for s in group))
    tenants = tuple(dict.fromkeys(t.strip() for given in args.tenant or ()
                                  for t in given.split(",") if t.strip()))
    return states, tenants


def node_lines(state: dict[str, Any]) -> list[str]:
    """Nodes and GPUs that take no new work, and why: cordoned (by an operator's drain or its
    failing health checks), GPUs out of service, lost nodes; then health warnings."""
    lines = []
    for node, by in state.get("cordoned", {n: {"operator": "drained"}
                                            for n in state.get("drained", ())}).items():
        why = "; ".join(f"{who}: {reason}" for who, reason in sorted(by.items()))
        lines.append(f"{node} cordoned ({why})")
    for node, gpus in state.get("gpus_out", {}).items():
        for gpu, why in gpus.items():
            lines.append(f"{node} GPU {gpu} out of service ({why})")
    lines += [f"{node} lost (no heartbeat)" for node in state.get("lost", ())]
    for node, warned in state.get("health_warnings", {}).items():
        short = warned if len(warned) <= 150 else warned[:149] + "…"
        lines.append(f"{node} health warnings: {short}")
    return lines


def status_table(state: dict[str, Any], rows: Sequence[Row], matched: int) -> Table:
    now = state["now"]
    total = len(state["jobs"])
    shown = f"{total} jobs" if len(rows) == total else \
        f"{len(rows)} of {matched} matching jobs ({total} in all)"
    nodes = node_lines(state)
    table = Table(title=f"{shown} · policy {state['policy']} · cycle {state['cycle']} · "
                        f"t={now:,.0f} s", caption=Text("\n".join(nodes)) if nodes else None,
                  caption_justify="left")
    right = ("GPUs", "progress", "ETA", "starts in", "pos")
    for col in ("job", "tenant", "model", "state", "GPUs", "progress", "ETA", "starts in",
                "pos", "reason"):
        table.add_column(col, justify="right" if col in right else "left")
    for j in rows:
        eta = "" if j["eta"] is None else f"{j['eta'] - now:,.0f} s"
        # A waiting job's forecast start (the scheduler's own cycles played forward with no
        # new arrivals); "?" where forecasts are on but it starts beyond their horizon.
        start = j.get("forecast_start_s")
        starts = until(start - now) if start is not None else \
            ("?" if j["state"] in STATE_GROUPS["waiting"] and state.get("forecast") else "")
        pos = "" if j["queue_position"] is None else str(j["queue_position"])
        table.add_row(j["job_id"], j["tenant"], j["model"], j["state"], str(j["gpus"]),
                      f"{100 * _progress(j):.0f}%", eta, starts, pos, j["reason"])
    return table
