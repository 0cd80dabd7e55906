"""`loom serve` and `loom up` take the streams' bounds (--stream-max-bytes, --stream-max-age,
--deadletter-max-bytes), and `up` passes them to every service it starts (whichever starts
first creates the streams): checked through `loom.cli.main`, without starting a process."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest

from loom import live_cli
from loom.cli import main
from loom.serve import ServeOptions, UpOptions, up_commands
from services.runtime.stream_limits import GIB, MIB, StreamLimits


async def _done() -> int:
    return 0


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, ServeOptions]:
    """Each service's `loom serve` options, as `up` (or `serve`) would start it."""
    served: dict[str, ServeOptions] = {}

    def serve(opts: ServeOptions) -> Coroutine[Any, Any, int]:
        served[opts.service] = opts
        return _done()

    def up(opts: UpOptions) -> Coroutine[Any, Any, int]:
        for argv in up_commands(opts, "nats://127.0.0.1:4222", origin=0.0):
            assert main(["serve", *argv]) == 0
        return _done()

    monkeypatch.setattr(live_cli, "serve", serve)
    monkeypatch.setattr(live_cli, "up", up)
    return served


UP = ["up", "--local-nodes", "1", "--gpus-per-node", "2", "--prometheus-port", "0"]


@pytest.mark.parametrize(("flags", "limits"), [
    ([], StreamLimits()),
    (["--stream-max-bytes", "500M", "--stream-max-age", "30d",
      "--deadletter-max-bytes", "64M"],
     StreamLimits(max_bytes=500 * MIB, max_age_s=30 * 86400.0, deadletter_max_bytes=64 * MIB)),
    (["--stream-max-bytes", "2GiB", "--stream-max-age", "3600"],
     StreamLimits(max_bytes=2 * GIB, max_age_s=3600.0)),
], ids=["defaults", "all", "some"])
def test_every_service_up_starts_gets_the_stream_limits(
        started: dict[str, ServeOptions], flags: list[str], limits: StreamLimits) -> None:
    assert main([*UP, *flags]) == 0
    assert set(started) == {"scheduler", "placer", "metrics", "nodeagent"}
    assert {s: o.stream_limits for s, o in started.items()} == dict.fromkeys(started, limits)


def test_serve_takes_them_itself(started: dict[str, ServeOptions]) -> None:
    assert main(["serve", "placer", "--cluster", "n1g4", "--stream-max-bytes", "1G"]) == 0
    assert started["placer"].stream_limits == StreamLimits(max_bytes=GIB)


@pytest.mark.parametrize(("flags", "error"), [
    (["--stream-max-bytes", "1K"], "--stream-max-bytes 1024: must be at least 1048576 bytes"),
    (["--stream-max-age", "60"], "--stream-max-age 60 s: 0 (no age limit) or from 600 s"),
    (["--deadletter-max-bytes", "1K"], "--deadletter-max-bytes 1024: must be at least"),
])
def test_a_bad_limit_fails_up_itself_naming_the_flag(
        started: dict[str, ServeOptions], flags: list[str], error: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*UP, *flags]) == 2
    assert error in " ".join(capsys.readouterr().err.split())
    assert started == {}  # nothing was started


@pytest.mark.parametrize("flags", [["--stream-max-bytes", "8X"], ["--stream-max-age", "3y"]])
def test_a_value_that_is_not_a_size_or_age_is_a_usage_error(
        flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*UP, *flags])
    assert exit_.value.code == 2
    assert "is not a" in capsys.readouterr().err
