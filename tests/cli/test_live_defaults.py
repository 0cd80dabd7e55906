"""Where the live commands find NATS when --nats-url is not given."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from loom.cli import build_parser, main
from loom.live_args import default_url, url_file


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


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("argv", [
    ["status"],
    ["submit", "--model", "cnn", "--gpus", "1", "--iterations", "5"],
    ["cancel", "job-1"],
    ["log", "export", "--out", "run.eventlog.gz"],
])
def test_an_unreachable_server_is_an_error_naming_it_not_endless_retries(
        argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"nats://127.0.0.1:{closed_port()}"
    assert main([*argv, "--nats-url", url]) == 3
    err = capsys.readouterr().err
    assert f"no server at {url}: connection refused" in err and "Traceback" not in err


def test_log_export_finds_nats_as_the_other_live_commands_do(
        runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`loom log export` defaults to the `loom up` running here, and its old `--url` still
    works (CLI flags are a contract), with a warning naming --nats-url."""
    url_file().parent.mkdir(parents=True)
    url_file().write_text("nats://127.0.0.1:40123\n")
    export = ["log", "export", "--out", "run.eventlog.gz"]
    assert build_parser().parse_args(export).nats_url == "nats://127.0.0.1:40123"
    assert capsys.readouterr().err == ""
    args = build_parser().parse_args([*export, "--url", "nats://a:1,nats://b:2"])
    assert args.nats_url == "nats://a:1,nats://b:2"
    assert capsys.readouterr().err == "warning: --url is deprecated; use --nats-url\n"
    args = build_parser().parse_args([*export, "--nats-url", "nats://c:3", "--nats-user", "u"])
    assert (args.nats_url, args.nats_user) == ("nats://c:3", "u")


def test_every_live_command_the_parser_knows_has_its_handler() -> None:
    """The parser's live commands (`loom.live_args`, light) and their handlers
    (`loom.live_cli`, loaded on use) are two lists: they must name the same commands."""
    from loom import live_args, live_cli

    assert set(live_args.COMMANDS) == set(live_cli.COMMANDS)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(live_args.COMMANDS) <= set(sub.choices)


def test_demo_timeout_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--timeout", "0"])
    assert exit_.value.code == 2 and "--timeout" in capsys.readouterr().err
