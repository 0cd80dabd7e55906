"""The stop request a trainer takes from SIGTERM/SIGINT, shared by the bundled trainer and the
trainer SDK (`loom.sdk`). Standard library only: the trainer's shell imports it before torch.

Until `arm()` the signals keep their default action (nothing trained yet that a checkpoint
would keep); after it, the first signal only sets `requested`, and the loop stops at the end
of its step, on every rank alike.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

__all__ = ["SignalStop"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalStop:
    """Stop request set by SIGTERM/SIGINT once `arm()` is called."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: str | None = None  # the first signal's name
        self._previous: dict[int, Any] = {}

    def arm(self) -> None:
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def disarm(self) -> None:
        """Give the signals back the handlers they had before `arm()` (a script goes on)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested:
            self.requested = True
            self.signal = signal.Signals(signum).name
