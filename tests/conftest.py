from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every body a core builds without validation is validated in the suite, and in the services
# it starts as subprocesses (services.runtime.trusted); set before any of Loom is imported.
os.environ["LOOM_CHECK_TRUSTED"] = "1"

from services.runtime.natsserver import EmbeddedNats, NatsServerError, find_binary


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every temporary folder the suite makes, and its subprocesses (TMPDIR), lands in one
    folder that is removed at the end: a test that kills a `loom up` or a nats-server
    (whose `loom-up-*` or `loom-nats-*` folder then stays) leaves nothing in /tmp."""
    base = tmp_path_factory.mktemp("tmpdir", numbered=True)
    saved_env, saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(base)
    try:
        yield base
    finally:
        tempfile.tempdir = saved
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(base, ignore_errors=True)


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
