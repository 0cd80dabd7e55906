from __future__ import annotations

import pytest

from services.runtime.natsserver import EmbeddedNats, NatsServerError, find_binary


@pytest.fixture
async def nats_server():  # type: ignore[no-untyped-def]
    """A private nats-server with JetStream on a free port and a temporary store."""
    try:
        find_binary()
    except NatsServerError as exc:  # pragma: no cover - the dev extra installs it
        pytest.fail(str(exc))
    server = await EmbeddedNats.start()
    try:
        yield server
    finally:
        await server.stop()
