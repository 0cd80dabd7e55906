from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from services.runtime.logging import configure


@pytest.fixture(autouse=True)
def live_log_stream() -> Iterator[None]:
    """Point service logs at this test's stderr, and put the previous set-up back afterwards.

    `services.runtime.logging.configure` binds the `sys.stderr` object of the moment; a test
    that ran `loom.cli.main` in-process leaves it bound to pytest's capture stream of that
    test, which is closed by now, and a shell that logs a dead letter would then crash.
    """
    saved = structlog.get_config()
    configure("warning")
    try:
        yield
    finally:
        structlog.configure(**saved)
