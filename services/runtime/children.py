"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """`preexec_fn` for a child: SIGTERM it when its parent dies (Linux; elsewhere nothing).

    `loom up` and `loom demo` start nats-server and every service as children; killed with
    SIGKILL (a CI timeout, an OOM kill) they could not stop them, and the children would run
    on, holding ports and GPUs. The SIGTERM gives each child its normal graceful stop.
    Linux sends it when the *thread* that started the child ends: start children from a
    thread that lives as long as they should (the event loop's).
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
