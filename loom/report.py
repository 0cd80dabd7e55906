"""Run outputs: `summary.json`, `jobs.csv`, and the results table people read."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from statistics import fmean

from rich.console import Group
from rich.table import Table
from rich.text import Text

from services.metrics.outcomes import JobOutcome

JOB_COLUMNS = (
    "job_id", "tenant", "model", "gpus", "submit_s", "start_s", "end_s", "jct_s",
    "queueing_s", "preemptions", "state", "deadline_s", "met_deadline", "ftf_rho", "pending_s",
)


def write_run(out: Path, summary: dict[str, object], jobs: Iterable[JobOutcome]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with (out / "jobs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JOB_COLUMNS)
        for j in sorted(jobs, key=lambda j: (j.submit_s, j.job_id)):
            w.writerow([
                j.job_id, j.tenant, j.model, j.gpus, _num(j.submit_s), _num(j.start_s),
                _num(j.end_s), _num(j.jct_s), _num(j.queueing_s), j.preemptions, j.state.value,
                _num(j.deadline_s), "" if j.met_deadline is None else int(j.met_deadline),
                _num(j.ftf_rho), _num(j.pending_s if j.end_s is not None else None),
            ])


def _num(x: float | None) -> str:
    return "" if x is None else repr(round(x, 6))


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# (summary key, column header, decimals) — times in seconds
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("policy", "policy", 0), ("finished", "done", 0), ("avg_jct_s", "avg JCT", 0),
    ("p50_jct_s", "p50 JCT", 0), ("p99_jct_s", "p99 JCT", 0), ("makespan_s", "makespan", 0),
    ("rejected", "rejected", 0), ("unfinished", "unfinished", 0),
    # Time to first start (the wait before a job's first launch) and time pending (every
    # wait, after preemptions too), averaged over jobs.
    ("avg_first_start_s", "to start", 0), ("avg_pending_s", "pending", 0),
    ("gpu_util", "util", 3),
    ("deadline_ratio", "deadline", 3), ("deadline_met", "met", 0), ("accepted", "accepted", 0),
    ("declined", "declined", 0),
    ("preemptions", "preempt", 0), ("wall_s", "wall", 2),
)


def _shown(key: str, summaries: Sequence[Mapping[str, object]]) -> bool:
    """A column appears when it says something: deadline counts only for deadline traces,
    declined jobs only under admission control."""
    if key == "deadline_met":
        return any(s.get("deadline_jobs") for s in summaries)
    if key in ("accepted", "declined"):  # admission control declined some
        return any(s.get("declined") for s in summaries)
    if key in ("rejected", "unfinished"):  # outcomes other than finished, when there are any
        return any(s.get(key) for s in summaries)
    return any(s.get(key) is not None for s in summaries)


def shown_columns(summaries: Sequence[Mapping[str, object]]) -> list[tuple[str, str, int]]:
    """The columns of `COLUMNS` that say something for these runs (see `_shown`)."""
    return [c for c in COLUMNS if _shown(c[0], summaries)]


def cell_text(value: object, digits: int = 1) -> str:
    """A summary value as the results table writes it."""
    return _fmt(value, digits)


def results_table(summaries: Sequence[dict[str, object]], title: str) -> Table:
    jobs = summaries[0].get("jobs") if summaries else None
    table = Table(title=f"{title} — {jobs} jobs, times in seconds", title_justify="left")
    show = shown_columns(summaries)
    for _, header, _ in show:
        table.add_column(header, justify="left" if header == "policy" else "right")
    for s in summaries:
        table.add_row(*[_fmt(s.get(key), digits) for key, _, digits in show])
    return table


def matrix_table(rows: Sequence[tuple[str, Mapping[str, object]]], title: str) -> Table:
    """The results of several traces in one table: each row a (trace label, run summary),
    a rule between traces."""
    table = Table(title=f"{title} — times in seconds", title_justify="left")
    show = shown_columns([s for _, s in rows])
    table.add_column("trace")
    table.add_column("jobs", justify="right")
    for _, header, _ in show:
        table.add_column(header, justify="left" if header == "policy" else "right")
    for i, (label, s) in enumerate(rows):
        last = i + 1 == len(rows) or rows[i + 1][0] != label
        first = i == 0 or rows[i - 1][0] != label
        table.add_row(label if first else "", _fmt(s.get("jobs")) if first else "",
                      *[_fmt(s.get(key), digits) for key, _, digits in show], end_section=last)
    return table


def sweep_table(
    curves: Mapping[str, Mapping[float, Sequence[float | None]]], title: str
) -> Group:
    """Rows = input job rates, columns = policies, cells = mean over seeds of the window's
    average JCT in hours; "—" where some seed's window did not finish."""
    table = Table()
    table.add_column("jobs/h", justify="right")
    for policy in curves:
        table.add_column(policy, justify="right")
    rates = list(dict.fromkeys(r for by_rate in curves.values() for r in by_rate))
    for rate in rates:
        cells = []
        for by_rate in curves.values():
            values = by_rate.get(rate, [])
            known = [v for v in values if v is not None]
            cells.append(f"{fmean(known) / 3600:,.2f}" if known and len(known) == len(values)
                         else "—")
        table.add_row(f"{rate:g}", *cells)
    # The title on a line of its own: Rich would wrap a table title to this narrow table.
    return Group(Text(f"{title} — avg JCT of the window (h), mean over seeds"), table)


# What each kind of rejection (the admission status code) means, as the outcome line says it.
REJECTION_REASONS: dict[str, str] = {
    "rejected_too_large": "too large for the cluster",
    "rejected_invalid": "invalid",
    "rejected_by_policy": "refused by the policy",
    "rejected_by_quota": "over a tenant quota",
}


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def outcome_line(summary: Mapping[str, object]) -> str:
    """Every job's outcome in one line: "60 jobs: 30 finished, 30 rejected (30 too large for
    the cluster), 0 unfinished"; the reasons come from the summary's `rejected_by`, and a run
    that replayed a trace's failures says how many."""
    jobs, finished = _count(summary.get("jobs")), _count(summary.get("finished"))
    rejected, unfinished = _count(summary.get("rejected")), _count(summary.get("unfinished"))
    text = f"{jobs:,} jobs: {finished:,} finished, {rejected:,} rejected"
    by = summary.get("rejected_by")
    if rejected and isinstance(by, Mapping) and by:
        reasons = ", ".join(f"{_count(n):,} {REJECTION_REASONS.get(str(code), str(code))}"
                            for code, n in sorted(by.items(), key=lambda kv: (-_count(kv[1]),
                                                                               str(kv[0]))))
        text += f" ({reasons})"
    text += f", {unfinished:,} unfinished"
    other = jobs - finished - rejected - unfinished
    if other > 0:
        text += f", {other:,} failed"
    replayed = _count(summary.get("failures_replayed"))
    if replayed:  # a run replaying a trace's failures (--replay-failures)
        text += f"; {replayed:,} recorded failures replayed"
    return text


def forecast_line(summary: Mapping[str, object]) -> str | None:
    """How far a run's start forecasts were from the starts (`loom sim --forecast-every`), in
    one line; None for a run without scored forecasts."""
    e = summary.get("forecast_error_s")
    if not isinstance(e, Mapping) or not _count(e.get("forecasts")):
        return None

    def s(key: str) -> str:
        value = e.get(key)
        return f"{value:,.0f} s" if isinstance(value, int | float) else "-"

    return (f"start forecasts: |forecast - start| median {s('median')}, p90 {s('p90')} over "
            f"{_count(e.get('forecasts')):,} forecasts of {_count(e.get('jobs')):,} jobs (the "
            f"first of each wait: median {s('first_median')}, p90 {s('first_p90')})")


def solver_line(summary: Mapping[str, object]) -> str | None:
    """What the policy's solver did over the run, in one line: "solver: 41 solves in 0.81 s
    (7 compiled); 2 kept an inaccurate answer; 1 fell back from the solver"; None for a
    policy that solves nothing (`Policy.solver_stats`)."""
    st = summary.get("solver")
    if not isinstance(st, Mapping):
        return None
    seconds = st.get("total_s")
    text = f"solver: {_count(st.get('solves')):,} solves"
    if isinstance(seconds, int | float):
        text += f" in {seconds:,.2f} s"
    if _count(st.get("compiles")):
        text += f" ({_count(st['compiles']):,} compiled)"
    notes = [(st.get("inaccurate"), "kept an inaccurate answer"),
             (st.get("secondary"), "answered by a later solver"),
             (st.get("fallbacks"), "fell back from the solver"),
             (st.get("timeouts"), "stopped at the time limit"),
             (st.get("failures"), "failed"),
             (st.get("unlaid"), "left to the greedy layout")]
    said = [f"{_count(n):,} {what}" for n, what in notes if _count(n)]
    return text + ("; " + "; ".join(said) if said else "")


def incomplete(summary: Mapping[str, object]) -> bool:
    """Whether some job was rejected or left unfinished (what `--strict` fails on)."""
    return _count(summary.get("rejected")) > 0 or _count(summary.get("unfinished")) > 0
