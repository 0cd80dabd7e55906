"""`report.html` of `loom compare --traces`: one self-contained page for a policy × trace matrix.

Everything is inline (CSS in a <style>, charts as inline SVG drawn by `loom.report_charts`,
no script), so the file opens offline and can be mailed or archived as it is. Per trace it
shows the results table, a JCT CDF per policy, the time to first start by job size, the
cluster's utilisation over time and each tenant's share of the GPU time.

What it is drawn from, per run: the summary (`summary.json`), the jobs' outcomes (the rows
of `jobs.csv`) and the metrics service's utilisation series (`MetricsCore.usage`), reduced
here to a few hundred points a chart (`cell_data`), so a 100,000-job trace gives a page of
the same size as a 60-job one.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loom.report import cell_text, incomplete, outcome_line, shown_columns
from loom.report_charts import (
    OTHER_COLOUR,
    TENANT_COLOURS,
    cdf_svg,
    duration,
    policy_colour,
    tenants_svg,
    thin_cdf,
    utilisation_svg,
    waits_svg,
)
from services.metrics.outcomes import JobOutcome, percentile


@dataclass(frozen=True)
class SizeWait:
    """Time to first start of the jobs of one size bucket (`lo`..`hi` GPUs) under one policy."""

    lo: int
    hi: int
    jobs: int  # jobs of this size in the run
    started: int  # of which started (the others were rejected or never ran)
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None

    @property
    def label(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}–{self.hi}"


@dataclass(frozen=True)
class CellData:
    """One (trace, policy) run, reduced to what the report draws."""

    policy: str
    summary: Mapping[str, object]
    finished: int
    cdf: tuple[tuple[float, float], ...]  # (JCT in s, fraction of finished jobs ≤ it)
    waits: tuple[SizeWait, ...]  # by job size, smallest first
    utilisation: tuple[tuple[float, float], ...]  # (bin start s, fraction of GPUs busy)
    tenant_gpu_s: Mapping[str, float]  # GPU-seconds each tenant held


@dataclass(frozen=True)
class TraceSection:
    """One trace of the matrix: its label (the `--traces` entry), a title and its runs."""

    label: str
    title: str
    cells: tuple[CellData, ...]
    note: str | None = None  # what the trace left out, as `loom compare` prints it
    anchor: str = ""  # the section's id in the page


def size_bucket(gpus: int) -> tuple[int, int]:
    """The power-of-two bucket of a job's GPU count: 1, 2, 3–4, 5–8, 9–16, ..."""
    hi = 1 << max(gpus - 1, 0).bit_length()
    return (1 if hi == 1 else hi // 2 + 1), hi


def cell_data(summary: Mapping[str, object], jobs: Iterable[JobOutcome],
              utilisation: Sequence[tuple[float, float]]) -> CellData:
    """What the report needs of one run: a thinned CDF, waits by size, the utilisation series
    and the tenants' GPU-seconds."""
    jcts: list[float] = []
    waits: dict[tuple[int, int], list[float]] = {}
    sizes: dict[tuple[int, int], int] = {}
    for job in jobs:
        if job.jct_s is not None:
            jcts.append(job.jct_s)
        bucket = size_bucket(job.gpus)
        sizes[bucket] = sizes.get(bucket, 0) + 1
        if job.queueing_s is not None:
            waits.setdefault(bucket, []).append(job.queueing_s)
    jcts.sort()
    buckets = []
    for bucket in sorted(sizes):
        values = sorted(waits.get(bucket, []))
        buckets.append(SizeWait(
            lo=bucket[0], hi=bucket[1], jobs=sizes[bucket], started=len(values),
            mean_s=sum(values) / len(values) if values else None,
            p50_s=percentile(values, 0.5) if values else None,
            p90_s=percentile(values, 0.9) if values else None))
    tenants = summary.get("tenants")
    gpu_s: dict[str, float] = {}
    if isinstance(tenants, Mapping):
        for name, row in tenants.items():
            value = row.get("gpu_s") if isinstance(row, Mapping) else None
            if isinstance(value, int | float) and value > 0:
                gpu_s[str(name)] = float(value)
    return CellData(policy=str(summary.get("policy")), summary=summary, finished=len(jcts),
                    cdf=thin_cdf(jcts), waits=tuple(buckets),
                    utilisation=tuple(utilisation), tenant_gpu_s=gpu_s)


# ---------------------------------------------------------------- the page


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       margin: 24px auto; max-width: 1320px; padding: 0 16px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin: 36px 0 6px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 14px; margin: 14px 0 4px; color: #444; }
p.meta, p.note { color: #555; margin: 2px 0; }
code { background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e4e4e4; text-align: right; }
th { background: #f6f6f6; font-weight: 600; }
th.left, td.left { text-align: left; }
td.best { font-weight: 700; }
table.waits, table.tenants { font-size: 12px; }
table.waits td, table.tenants td { white-space: nowrap; }
div.scroll { overflow-x: auto; max-width: 100%; }
tr.warn td { color: #9a6700; }
nav a { margin-right: 12px; }
.legend { margin: 6px 0; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 5px;
            vertical-align: -1px; border-radius: 2px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(600px, 1fr));
          gap: 8px 24px; }
figure { margin: 0; min-width: 0; }
figcaption { font-weight: 600; color: #444; margin: 6px 0 2px; }
svg.chart { max-width: 100%; height: auto; background: #fff; }
svg .grid { stroke: #e8e8e8; stroke-width: 1; }
svg .axis { stroke: #555; fill: none; stroke-width: 1; }
svg .tick { font-size: 11px; fill: #555; }
svg .label { font-size: 12px; fill: #333; }
svg .line { fill: none; stroke-width: 2; }
svg .line.thin { stroke-width: 1.4; stroke-opacity: 0.9; }
"""


def _legend(items: Sequence[tuple[str, str]]) -> str:
    spans = "".join(f'<span><i style="background:{colour}"></i>{_e(name)}</span>'
                    for name, colour in items)
    return f'<div class="legend">{spans}</div>'


def results_html(section: TraceSection) -> str:
    """The trace's results table: the columns `loom compare` prints."""
    summaries = [dict(c.summary) for c in section.cells]
    columns = shown_columns(summaries)
    head = "".join(f'<th class="{"left" if key == "policy" else ""}">{_e(header)}</th>'
                   for key, header, _ in columns)
    rows = []
    for s in summaries:
        cells = "".join(f'<td class="{"left" if key == "policy" else ""}">'
                        f"{_e(cell_text(s.get(key), digits))}</td>"
                        for key, _, digits in columns)
        rows.append(f'<tr class="{"warn" if incomplete(s) else ""}">{cells}</tr>')
    outcomes = "".join(f"<li>{_e(s.get('policy'))}: {_e(outcome_line(s))}</li>"
                       for s in summaries)
    return (f'<table class="results"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>'
            f'<ul class="outcomes">{outcomes}</ul>')


def waits_html(section: TraceSection) -> str:
    """The numbers behind the waits chart: a row per job size, a column per policy."""
    buckets = sorted({(w.lo, w.hi) for cell in section.cells for w in cell.waits})
    if not buckets:
        return ""
    head = "".join(f"<th>{_e(cell.policy)}</th>" for cell in section.cells)
    rows = []
    for lo, hi in buckets:
        tds = []
        for cell in section.cells:
            w = next((w for w in cell.waits if (w.lo, w.hi) == (lo, hi)), None)
            tds.append("<td>—</td>" if w is None else
                       f"<td>{_e(duration(w.mean_s))} / {_e(duration(w.p90_s))}"
                       f" <small>({w.started:,}/{w.jobs:,})</small></td>")
        size = f"{lo} GPU" if lo == hi == 1 else f"{lo if lo == hi else f'{lo}–{hi}'} GPUs"
        rows.append(f'<tr><td class="left">{_e(size)}</td>{"".join(tds)}</tr>')
    return (f'<div class="scroll"><table class="waits"><thead><tr><th class="left">mean / '
            f'p90 (started/jobs)</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
            "</table></div>")


def _tenant_rows(summary: Mapping[str, object]) -> dict[str, Mapping[str, object]]:
    tenants = summary.get("tenants")
    if not isinstance(tenants, Mapping):
        return {}
    return {str(t): row for t, row in tenants.items() if isinstance(row, Mapping)}


def tenants_html(section: TraceSection, named: Sequence[str]) -> str:
    """Per tenant and policy: its share of the GPU time and its jobs' average JCT (the share
    is the same under every policy when every job finishes; the JCT is not)."""
    if len(named) < 2:
        return ""
    head = "".join(f"<th>{_e(cell.policy)}</th>" for cell in section.cells)
    rows = []
    for tenant in named:
        tds = []
        for cell in section.cells:
            total = sum(cell.tenant_gpu_s.values())
            by_tenant = _tenant_rows(cell.summary)
            mine = ([r for t, r in by_tenant.items() if t not in named]
                    if tenant == "other tenants" else [by_tenant.get(tenant, {})])
            gpu_s = sum(float(v) for r in mine if isinstance(v := r.get("gpu_s"), int | float))
            weighted = [(float(a), int(f)) for r in mine
                        if isinstance(a := r.get("avg_jct_s"), int | float)
                        and isinstance(f := r.get("finished"), int) and f > 0]
            finished = sum(f for _, f in weighted)
            jct = sum(a * f for a, f in weighted) / finished if finished else None
            share = f"{gpu_s / total:.1%}" if total > 0 else "—"
            tds.append(f"<td>{_e(share)} · {_e(duration(jct))}</td>")
        rows.append(f'<tr><td class="left">{_e(tenant)}</td>{"".join(tds)}</tr>')
    return (f'<div class="scroll"><table class="tenants"><thead><tr><th class="left">GPU '
            f'time · avg JCT</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            "</div>")


OVERVIEW = (("avg_jct_s", "avg JCT", True), ("p99_jct_s", "p99 JCT", True),
            ("avg_first_start_s", "to start", True), ("gpu_util", "util", False))


def overview_html(sections: Sequence[TraceSection], policies: Sequence[str]) -> str:
    """The matrix at a glance: rows are policies, a group of columns per trace; the best
    value of each column in bold."""
    top = "".join(f'<th colspan="{len(OVERVIEW)}"><a href="#{_e(s.anchor)}">{_e(s.label)}'
                  f"</a></th>" for s in sections)
    sub = "".join(f"<th>{_e(header)}</th>" for _ in sections for _, header, _ in OVERVIEW)
    best: dict[tuple[int, str], float] = {}
    for i, section in enumerate(sections):
        for key, _, lower in OVERVIEW:
            values = [v for c in section.cells
                      if isinstance(v := c.summary.get(key), int | float)]
            if values:
                best[(i, key)] = min(values) if lower else max(values)
    rows = []
    for policy in policies:
        tds = []
        for i, section in enumerate(sections):
            cell = next((c for c in section.cells if c.policy == policy), None)
            for key, _, _ in OVERVIEW:
                value = None if cell is None else cell.summary.get(key)
                text = ("—" if not isinstance(value, int | float) else
                        f"{value:.1%}" if key == "gpu_util" else duration(float(value)))
                if cell is not None and incomplete(cell.summary) and key == "avg_jct_s":
                    text += "*"
                mark = ' class="best"' if isinstance(value, int | float) and len(
                    section.cells) > 1 and value == best.get((i, key)) else ""
                tds.append(f"<td{mark}>{_e(text)}</td>")
        rows.append(f'<tr><td class="left">{_e(policy)}</td>{"".join(tds)}</tr>')
    return (f'<table class="overview"><thead><tr><th class="left" rowspan="2">policy</th>'
            f"{top}</tr><tr>{sub}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def render(sections: Sequence[TraceSection], policies: Sequence[str],
           command: str | None = None) -> str:
    """The whole page, as one string."""
    legend = _legend([(p, policy_colour(policies, p)) for p in policies])
    body = [f"<h1>Loom: {len(policies)} {'policy' if len(policies) == 1 else 'policies'} × "
            f"{len(sections)} {'trace' if len(sections) == 1 else 'traces'}</h1>"]
    if command:
        body.append(f'<p class="meta">made by <code>{_e(command)}</code></p>')
    body.append('<p class="meta">Times are virtual (simulated) time. JCT: submission to '
                "finish, over finished jobs. To start: submission to first launch. Util: "
                "GPU-time held over GPU-time available from the first submission to the "
                "last finish. * some jobs rejected or left unfinished: the averages leave "
                "them out (see the trace's outcomes).</p>")
    body.append("<nav>" + "".join(f'<a href="#{_e(s.anchor)}">{_e(s.label)}</a>'
                                  for s in sections) + "</nav>")
    body.append("<h2>All traces</h2>" + legend + overview_html(sections, policies))
    for section in sections:
        tenants_chart, tenants = tenants_svg(section, policies)
        tenant_legend = _legend([
            (t, OTHER_COLOUR if t == "other tenants" else TENANT_COLOURS[k % len(
                TENANT_COLOURS)]) for k, t in enumerate(tenants)])
        body.append(f'<section id="{_e(section.anchor)}" data-trace="{_e(section.label)}">')
        body.append(f"<h2>{_e(section.label)}</h2>")
        body.append(f'<p class="meta">{_e(section.title)}</p>')
        if section.note:
            body.append(f'<p class="note">{_e(section.note)}</p>')
        body.append("<h3>Results (times in seconds)</h3>" + results_html(section))
        body.append(legend)
        body.append('<div class="charts">')
        body.append("<figure><figcaption>Job completion time, CDF</figcaption>"
                    f"{cdf_svg(section, policies)}</figure>")
        body.append("<figure><figcaption>Time to first start by job size (mean)</figcaption>"
                    f"{waits_svg(section, policies)}{waits_html(section)}</figure>")
        body.append("<figure><figcaption>GPU utilisation over time</figcaption>"
                    f"{utilisation_svg(section, policies)}</figure>")
        body.append("<figure><figcaption>Share of GPU time by tenant</figcaption>"
                    f"{tenants_chart}{tenant_legend}{tenants_html(section, tenants)}"
                    "</figure>")
        body.append("</div></section>")
    title = "Loom compare: " + ", ".join(s.label for s in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def write_report(path: Path, sections: Sequence[TraceSection], policies: Sequence[str],
                 command: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(sections, policies, command), encoding="utf-8")
    return path
