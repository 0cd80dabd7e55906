"""The inline SVG charts of `report.html`; `loom.html_report` assembles the data and the page.

One function per chart of a trace's runs (JCT CDF, time to first start by job size,
utilisation over time, tenants' shares), each a self-contained <svg> string with the numbers
in <title>s (the page has no script). The time units and colours are shared with the page's
tables, so both print a time and a policy alike.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loom.html_report import CellData, TraceSection


CDF_POINTS = 400  # at most this many points per CDF line
TENANTS_SHOWN = 8  # the largest tenants by GPU time; the rest are drawn as "other"

# Tableau 10: distinct, readable on white, and in order of decreasing contrast.
POLICY_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
TENANT_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02",
                  "#a6761d", "#1f78b4")
OTHER_COLOUR = "#c8c8c8"


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


# ---------------------------------------------------------------- times and ticks


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


def policy_colour(policies: Sequence[str], policy: str) -> str:
    """By the policy's place in `policies`: the same in every chart and legend of the page."""
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
        colour = policy_colour(policies, cell.policy)
        parts.append(f'<path class="line" data-policy="{_e(cell.policy)}" '
                     f'stroke="{colour}" d="{"".join(path)}">'
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
                         f'fill="{policy_colour(policies, cell.policy)}">'
                         f"<title>{_e(tip)}</title></rect>")
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
        colour = policy_colour(policies, cell.policy)
        parts.append(f'<path class="line thin" data-policy="{_e(cell.policy)}" '
                     f'stroke="{colour}" d="{"".join(path)}">'
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

