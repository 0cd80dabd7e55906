"""Where the live commands find NATS when --nats-url is not given."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.serve import default_url, url_file


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("LOOM_NATS_URL", raising=False)
    return tmp_path


def test_the_standard_port_when_nothing_says_otherwise() -> None:
    assert default_url() == "nats://127.0.0.1:4222"


def test_a_running_loom_up_is_found(runtime_dir: Path) -> None:
    url_file().parent.mkdir(parents=True)
    url_file().write_text("nats://127.0.0.1:40123\n")
    assert url_file().is_relative_to(runtime_dir)
    assert default_url() == "nats://127.0.0.1:40123"


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    url_file().parent.mkdir(parents=True)
    url_file().write_text("nats://127.0.0.1:40123")
    monkeypatch.setenv("LOOM_NATS_URL", "nats://a:1,nats://b:2")
    assert default_url() == "nats://a:1,nats://b:2"
