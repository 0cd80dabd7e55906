"""Busy GPU-seconds over time in bounded, aligned bins (the utilisation-over-time plot)."""

from __future__ import annotations

import math


class UsageSeries:
    """Busy GPU-seconds over time, in equal bins, for a utilisation-over-time plot.

    At most `max_bins` bins, from the start of the first busy interval: when the run outgrows
    them, neighbouring pairs merge and the width doubles. Bins stay aligned (the width is the
    first one times a power of two), so a merged bin holds exactly the GPU-seconds of its
    span, and memory stays bounded however long the run. It only observes: no decision and
    no digest reads it.
    """

    __slots__ = ("bins", "max_bins", "origin", "width")

    def __init__(self, width_s: float = 1.0, max_bins: int = 512) -> None:
        if width_s <= 0 or max_bins < 2:
            raise ValueError("a usage series needs a positive width and at least 2 bins")
        self.width = width_s
        self.max_bins = max_bins
        self.origin: float | None = None  # start of bin 0: the first busy moment
        self.bins: list[float] = []  # GPU-seconds held in each bin

    def add(self, start: float, end: float, gpus: int) -> None:
        """`gpus` GPUs were busy from `start` to `end`."""
        if gpus <= 0 or end <= start:
            return
        if self.origin is None:
            self.origin = start
        lo, hi = max(start - self.origin, 0.0), end - self.origin
        while hi > self.width * self.max_bins:
            self._coarsen()
        i = int(lo // self.width)
        while lo < hi:
            edge = (i + 1) * self.width
            if edge <= lo:  # float rounding at a bin edge
                i += 1
                continue
            stop = min(hi, edge)
            if i >= len(self.bins):
                self.bins.extend([0.0] * (i + 1 - len(self.bins)))
            self.bins[i] += gpus * (stop - lo)
            lo = stop
            i += 1

    def copy(self) -> UsageSeries:
        twin = UsageSeries(self.width, self.max_bins)
        twin.origin, twin.bins = self.origin, list(self.bins)
        return twin

    def _coarsen(self) -> None:
        self.bins = _pairs_merged(self.bins)
        self.width *= 2

    def utilisation(self, total_gpus: int, end: float) -> list[tuple[float, float]]:
        """(bin start, fraction of `total_gpus` busy in the bin) up to `end`; the last bin's
        fraction is over the part of it before `end`."""
        if self.origin is None or total_gpus <= 0 or end <= self.origin:
            return []
        span = end - self.origin
        bins, width = self.bins, self.width
        while span > width * self.max_bins:  # an idle tail past the last busy bin
            bins, width = _pairs_merged(bins), width * 2
        points = []
        for i in range(max(1, math.ceil(span / width))):
            start = i * width
            length = min(width, span - start)
            busy = bins[i] if i < len(bins) else 0.0
            points.append((self.origin + start,
                           busy / (total_gpus * length) if length > 0 else 0.0))
        return points


def _pairs_merged(bins: list[float]) -> list[float]:
    return [bins[k] + (bins[k + 1] if k + 1 < len(bins) else 0.0)
            for k in range(0, len(bins), 2)]
