"""Plots written next to run outputs (matplotlib, headless).

Figures are made directly (`matplotlib.figure.Figure`), not through pyplot: files only, no
display, no global figure registry, and matplotlib is imported only when a plot is drawn
(it is a third of `loom`'s start-up otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _axes() -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=120)
    return fig, fig.add_subplot()


def jct_cdf(jcts: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """One CDF curve of job completion time per policy, log-scaled time axis."""
    fig, ax = _axes()
    for policy, values in jcts.items():
        xs = sorted(v for v in values if v > 0)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{policy} (n={len(xs)})")
    ax.set_xscale("log")
    _plain_log_labels(ax.xaxis)
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.005)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, ax, path, title, "lower right")


def jct_vs_load(curves: Mapping[str, Mapping[float, Sequence[float]]], path: Path,
                title: str) -> Path:
    """Average JCT (hours) against input job rate (jobs/hr), as Gavel's figures draw it: one
    line per policy through the mean over seeds, a band from the lowest seed to the highest.

    `curves` maps policy → rate → the seeds' average JCTs in seconds.
    """
    fig, ax = _axes()
    for policy, by_rate in curves.items():
        rates = sorted(r for r, values in by_rate.items() if values)
        if not rates:
            continue
        hours = [[v / 3600 for v in by_rate[r]] for r in rates]
        (line,) = ax.plot(rates, [sum(h) / len(h) for h in hours], marker="o", label=policy)
        if any(len(h) > 1 for h in hours):
            ax.fill_between(rates, [min(h) for h in hours], [max(h) for h in hours],
                            color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("input job rate (jobs/hr)")
    ax.set_ylabel("average JCT (hours)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    return _save(fig, ax, path, title, "upper left")


def _plain_log_labels(axis: Any) -> None:
    """Label a log axis's decades as plain numbers (1,000 rather than 10³): matplotlib's
    default writes them as mathtext, whose parser took about a third of drawing a CDF."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 1 else f"{x:g}"))
    axis.set_minor_formatter(NullFormatter())


def _save(fig: Any, ax: Any, path: Path, title: str, legend: str) -> Path:
    ax.set_title(title)
    ax.legend(loc=legend)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
