"""Plots written next to run outputs (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt


def jct_cdf(jcts: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """One CDF curve of job completion time per policy, log-scaled time axis."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for policy, values in jcts.items():
        xs = sorted(v for v in values if v > 0)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{policy} (n={len(xs)})")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.005)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
