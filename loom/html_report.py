"""`report.html` of `loom compare --traces`: one self-contained page for a policy × trace matrix.

Everything is inline (CSS in a <style>, charts as inline SVG drawn here, no script), so the
file opens offline and can be mailed or archived as it is. Per trace it shows the results
table, a JCT CDF per policy, the time to first start by job size, the cluster's utilisation
over time and each tenant's share of the GPU time.

What it is drawn from, per run: the summary (`summary.json`), the jobs' outcomes (the rows
of `jobs.csv`) and the metrics service's utilisation series (`MetricsCore.usage`), reduced
here to a few hundred points a chart (`cell_data`), so a 100,000-job trace gives a page of
the same size as a 60-job one.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loom.report import cell_text, incomplete, outcome_line, shown_columns
from services.metrics.core import JobOutcome, percentile

CDF_POINTS = 400  # at most this many points per CDF line
TENANTS_SHOWN = 8  # the largest tenants by GPU time; the rest are drawn as "other"

# Tableau 10: distinct, readable on white, and in order of decreasing contrast.
POLICY_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
TENANT_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02",
                  "#a6761d", "#1f78b4")
OTHER_COLOUR = "#c8c8c8"


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


def thin_cdf(sorted_values: Sequence[float], points: int = CDF_POINTS
             ) -> tuple[tuple[float, float], ...]:
    """The empirical CDF of `sorted_values` at no more than `points` (+1) of them, evenly
    spaced in rank, the smallest and the largest always among them."""
    n = len(sorted_values)
    if n == 0:
        return ()
    if n <= points:
        ranks: Iterable[int] = range(n)
    else:
        ranks = sorted({0, *(round((k + 1) * n / points) - 1 for k in range(points))})
    return tuple((sorted_values[i], (i + 1) / n) for i in ranks)


# ---------------------------------------------------------------- formatting


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


TIME_UNITS = ((1.0, "s"), (60.0, "min"), (3600.0, "h"), (86400.0, "d"))


def time_unit(largest_s: float) -> tuple[float, str]:
    """The unit to show times up to `largest_s` in: s below 2 min, min below 2 h, h below
    2 d, else d."""
    unit = TIME_UNITS[0]
    for candidate in TIME_UNITS:
        if largest_s >= 2 * candidate[0]:
            unit = candidate
    return unit


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    size, name = time_unit(abs(seconds))
    value = seconds / size
    return f"{value:,.0f} {name}" if abs(value) >= 100 or size == 1.0 else f"{value:,.1f} {name}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 × 10^k apart), the first at or below `lo`, the last at
    or above `hi`."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    k = math.floor(lo / step)
    ticks = [round(k * step, 10)]
    while ticks[-1] < hi - step * 1e-9:
        k += 1
        ticks.append(round(k * step, 10))
    return ticks


# JCT axis ticks: durations people read at a glance; those that fit are drawn (log axis).
LOG_TICKS = ((0.1, "0.1 s"), (1.0, "1 s"), (2.0, "2 s"), (5.0, "5 s"), (10.0, "10 s"),
             (30.0, "30 s"), (60.0, "1 min"), (120.0, "2 min"), (300.0, "5 min"),
             (600.0, "10 min"), (1800.0, "30 min"), (3600.0, "1 h"), (7200.0, "2 h"),
             (21600.0, "6 h"), (43200.0, "12 h"), (86400.0, "1 d"), (172800.0, "2 d"),
             (604800.0, "1 wk"), (1209600.0, "2 wk"), (2592000.0, "30 d"),
             (7776000.0, "90 d"), (31536000.0, "1 y"))
TICK_GAP_PX = 52  # at least this far apart


# ---------------------------------------------------------------- SVG charts


@dataclass(frozen=True)
class _Frame:
    """A chart's plotting area and its data ranges; `sx`/`sy` map data to pixels."""

    x0: float
    x1: float
    y0: float
    y1: float
    xlog: bool = False
    width: int = 600
    height: int = 300
    left: int = 64
    right: int = 28
    top: int = 16
    bottom: int = 44

    def _fx(self, x: float) -> float:
        if self.xlog:
            lo, hi, x = math.log10(self.x0), math.log10(self.x1), math.log10(max(x, self.x0))
        else:
            lo, hi = self.x0, self.x1
        return (x - lo) / (hi - lo) if hi > lo else 0.0

    def sx(self, x: float) -> float:
        return self.left + self._fx(x) * (self.width - self.left - self.right)

    def sy(self, y: float) -> float:
        span = self.y1 - self.y0
        frac = (y - self.y0) / span if span > 0 else 0.0
        return self.height - self.bottom - frac * (self.height - self.top - self.bottom)


def _svg_open(frame: _Frame, label: str, kind: str) -> list[str]:
    return [f'<svg class="chart" data-chart="{_e(kind)}" role="img" aria-label="{_e(label)}" '
            f'width="{frame.width}" height="{frame.height}" '
            f'viewBox="0 0 {frame.width} {frame.height}">',
            f"<title>{_e(label)}</title>"]


def _axes(frame: _Frame, xticks: Sequence[tuple[float, str]],
          yticks: Sequence[tuple[float, str]], xlabel: str, ylabel: str) -> list[str]:
    parts = []
    bottom, top = frame.height - frame.bottom, frame.top
    left, right = frame.left, frame.width - frame.right
    for y, text in yticks:
        py = frame.sy(y)
        parts.append(f'<line class="grid" x1="{left}" y1="{py:.1f}" x2="{right}" '
                     f'y2="{py:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{py + 4:.1f}" '
                     f'text-anchor="end">{_e(text)}</text>')
    for x, text in xticks:
        px = frame.sx(x)
        parts.append(f'<line class="grid" x1="{px:.1f}" y1="{top}" x2="{px:.1f}" '
                     f'y2="{bottom}"/>')
        parts.append(f'<text class="tick" x="{px:.1f}" y="{bottom + 16}" '
                     f'text-anchor="middle">{_e(text)}</text>')
    parts.append(f'<path class="axis" d="M{left},{top} V{bottom} H{right}"/>')
    parts.append(f'<text class="label" x="{(left + right) / 2:.1f}" y="{frame.height - 6}" '
                 f'text-anchor="middle">{_e(xlabel)}</text>')
    parts.append(f'<text class="label" transform="translate(14,{(top + bottom) / 2:.1f}) '
                 f'rotate(-90)" text-anchor="middle">{_e(ylabel)}</text>')
    return parts


def _no_data(frame: _Frame, label: str, kind: str, why: str) -> str:
    parts = _svg_open(frame, label, kind)
    parts.append(f'<text class="label" x="{frame.width / 2}" y="{frame.height / 2}" '
                 f'text-anchor="middle">{_e(why)}</text></svg>')
    return "".join(parts)


def _colour(policies: Sequence[str], policy: str) -> str:
    return POLICY_COLOURS[policies.index(policy) % len(POLICY_COLOURS)]


def cdf_svg(section: TraceSection, policies: Sequence[str]) -> str:
    """One step line per policy: the fraction of finished jobs whose JCT is at most x (log x)."""
    label = f"JCT CDF, {section.title}"
    values = [x for cell in section.cells for x, _ in cell.cdf if x > 0]
    if not values:
        return _no_data(_Frame(0, 1, 0, 1), label, "cdf", "no job finished")
    lo, hi = min(values), max(values)
    if hi <= lo * 1.5:
        lo, hi = lo / 2, hi * 2
    frame = _Frame(lo, hi, 0.0, 1.0, xlog=True)
    xticks: list[tuple[float, str]] = []
    for value, text in LOG_TICKS:
        if lo <= value <= hi and (not xticks or
                                  frame.sx(value) - frame.sx(xticks[-1][0]) >= TICK_GAP_PX):
            xticks.append((value, text))
    if len(xticks) < 2:
        xticks = [(lo, duration(lo)), (hi, duration(hi))]
    yticks = [(y, f"{y:.0%}") for y in (0.0, 0.25, 0.5, 0.75, 1.0)]
    parts = _svg_open(frame, label, "cdf")
    parts += _axes(frame, xticks, yticks, "job completion time (log scale)", "jobs finished")
    for cell in section.cells:
        points = [(x, y) for x, y in cell.cdf if x > 0]
        if not points:
            continue
        path = [f"M{frame.sx(points[0][0]):.1f},{frame.sy(0.0):.1f}"]
        for x, y in points:
            path.append(f"H{frame.sx(x):.1f}V{frame.sy(y):.1f}")
        avg = cell.summary.get("avg_jct_s")
        tip = (f"{cell.policy}: {cell.finished:,} finished, avg JCT "
               f"{duration(avg if isinstance(avg, float) else None)}")
        parts.append(f'<path class="line" data-policy="{_e(cell.policy)}" '
                     f'stroke="{_colour(policies, cell.policy)}" d="{"".join(path)}">'
                     f"<title>{_e(tip)}</title></path>")
    parts.append("</svg>")
    return "".join(parts)


def waits_svg(section: TraceSection, policies: Sequence[str]) -> str:
    """Grouped bars: mean time to first start per job-size bucket, one bar per policy."""
    label = f"time to first start by job size, {section.title}"
    buckets = sorted({(w.lo, w.hi) for cell in section.cells for w in cell.waits})
    means = [w.mean_s for cell in section.cells for w in cell.waits if w.mean_s is not None]
    if not buckets or not means:
        return _no_data(_Frame(0, 1, 0, 1), label, "waits", "no job started")
    size, unit = time_unit(max(means))
    ticks = nice_ticks(0.0, max(max(means) / size, 1.0))  # every job at once: 0–1 s
    frame = _Frame(0.0, float(len(buckets)), 0.0, ticks[-1] * size)
    yticks = [(t * size, f"{t:,g} {unit}") for t in ticks]
    xticks = [(i + 0.5, (str(lo) if lo == hi else f"{lo}–{hi}"))
              for i, (lo, hi) in enumerate(buckets)]
    parts = _svg_open(frame, label, "waits")
    parts += _axes(frame, xticks, yticks, "GPUs a job asked for", "mean time to first start")
    group = (frame.sx(1.0) - frame.sx(0.0)) * 0.8
    bar = group / max(len(section.cells), 1)
    for k, cell in enumerate(section.cells):
        by_bucket = {(w.lo, w.hi): w for w in cell.waits}
        for i, bucket in enumerate(buckets):
            w = by_bucket.get(bucket)
            if w is None or w.mean_s is None:
                continue
            x = frame.sx(float(i)) + (frame.sx(1.0) - frame.sx(0.0)) * 0.1 + k * bar
            y = frame.sy(w.mean_s)
            height = frame.sy(0.0) - y
            tip = (f"{cell.policy}, {w.label} GPUs: mean {duration(w.mean_s)}, p50 "
                   f"{duration(w.p50_s)}, p90 {duration(w.p90_s)} ({w.started:,} of "
                   f"{w.jobs:,} jobs started)")
            parts.append(f'<rect class="bar" data-policy="{_e(cell.policy)}" x="{x:.1f}" '
                         f'y="{y:.1f}" width="{max(bar - 1, 1):.1f}" '
                         f'height="{max(height, 0.5):.1f}" '
                         f'fill="{_colour(policies, cell.policy)}"><title>{_e(tip)}</title>'
                         f"</rect>")
    parts.append("</svg>")
    return "".join(parts)


def utilisation_svg(section: TraceSection, policies: Sequence[str]) -> str:
    """One step line per policy: the fraction of the cluster's GPUs busy, over trace time."""
    label = f"GPU utilisation over time, {section.title}"
    series = [(cell, _steps(cell)) for cell in section.cells]
    ends = [steps[-1][1] for _, steps in series if steps]
    if not ends:
        return _no_data(_Frame(0, 1, 0, 1), label, "utilisation", "no GPU was used")
    end = max(ends)
    size, unit = time_unit(end)
    ticks = nice_ticks(0.0, end / size, 6)
    frame = _Frame(0.0, ticks[-1] * size, 0.0, 1.0)
    xticks = [(t * size, f"{t:,g}") for t in ticks]
    yticks = [(y, f"{y:.0%}") for y in (0.0, 0.25, 0.5, 0.75, 1.0)]
    parts = _svg_open(frame, label, "utilisation")
    parts += _axes(frame, xticks, yticks, f"time since the trace's start ({unit})",
                   "GPUs busy")
    for cell, steps in series:
        if not steps:
            continue
        path = [f"M{frame.sx(steps[0][0]):.1f},{frame.sy(steps[0][2]):.1f}"]
        for _, stop, value in steps:
            path.append(f"V{frame.sy(value):.1f}H{frame.sx(stop):.1f}")
        util = cell.summary.get("gpu_util")
        tip = f"{cell.policy}: {util:.1%} busy over the run" if isinstance(util, float) \
            else cell.policy
        parts.append(f'<path class="line thin" data-policy="{_e(cell.policy)}" '
                     f'stroke="{_colour(policies, cell.policy)}" d="{"".join(path)}">'
                     f"<title>{_e(tip)}</title></path>")
    parts.append("</svg>")
    return "".join(parts)


def _steps(cell: CellData) -> list[tuple[float, float, float]]:
    """(start, end, busy fraction) of each bin of a run's utilisation series."""
    points = cell.utilisation
    if not points:
        return []
    width = points[1][0] - points[0][0] if len(points) > 1 else 0.0
    makespan = cell.summary.get("makespan_s")
    steps = []
    for i, (start, value) in enumerate(points):
        stop = points[i + 1][0] if i + 1 < len(points) else start + width
        if i + 1 == len(points) and isinstance(makespan, float) and start < makespan < stop:
            stop = makespan
        steps.append((start, max(stop, start), min(max(value, 0.0), 1.0)))
    return steps


def tenants_svg(section: TraceSection, policies: Sequence[str]) -> tuple[str, list[str]]:
    """A stacked bar per policy: each tenant's share of the GPU time; the chart and the
    tenants it names (the largest `TENANTS_SHOWN`, then "other")."""
    label = f"share of GPU time by tenant, {section.title}"
    totals: dict[str, float] = {}
    for cell in section.cells:
        for tenant, gpu_s in cell.tenant_gpu_s.items():
            totals[tenant] = totals.get(tenant, 0.0) + gpu_s
    if not totals:
        return _no_data(_Frame(0, 1, 0, 1, height=120), label, "tenants",
                        "no GPU time held"), []
    named = sorted(totals, key=lambda t: (-totals[t], t))[:TENANTS_SHOWN]
    rows = len(section.cells)
    frame = _Frame(0.0, 1.0, 0.0, float(rows), height=44 + 30 * rows + 16, left=110)
    parts = _svg_open(frame, label, "tenants")
    xticks = [(x, f"{x:.0%}") for x in (0.0, 0.25, 0.5, 0.75, 1.0)]
    parts += _axes(frame, xticks, [], "share of the GPU time held", "")
    for row, cell in enumerate(section.cells):
        total = sum(cell.tenant_gpu_s.values())
        y = frame.sy(float(rows - row)) + 5
        height = frame.sy(0.0) - frame.sy(1.0) - 10
        parts.append(f'<text class="tick" x="{frame.left - 6}" y="{y + height / 2 + 4:.1f}" '
                     f'text-anchor="end">{_e(cell.policy)}</text>')
        if total <= 0:
            continue
        other = total - sum(cell.tenant_gpu_s.get(t, 0.0) for t in named)
        share_at = 0.0
        segments = [(t, cell.tenant_gpu_s.get(t, 0.0), TENANT_COLOURS[k % len(TENANT_COLOURS)])
                    for k, t in enumerate(named)]
        segments.append(("other tenants", other, OTHER_COLOUR))
        for name, gpu_s, colour in segments:
            if gpu_s <= 0:
                continue
            share = gpu_s / total
            x0, x1 = frame.sx(share_at), frame.sx(share_at + share)
            tip = f"{cell.policy}, {name}: {share:.1%} of {total / 3600:,.1f} GPU-hours"
            parts.append(f'<rect class="seg" x="{x0:.1f}" y="{y:.1f}" '
                         f'width="{max(x1 - x0, 0.5):.1f}" height="{height:.1f}" '
                         f'fill="{colour}"><title>{_e(tip)}</title></rect>')
            share_at += share
    parts.append("</svg>")
    return "".join(parts), named + (["other tenants"] if len(totals) > len(named) else [])


# ---------------------------------------------------------------- the page


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
    legend = _legend([(p, _colour(policies, p)) for p in policies])
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
