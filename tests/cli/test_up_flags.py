"""`loom up` takes the scheduler's node-fault flags that `loom serve` takes, and the scheduler it
starts gets them; both take the streams' bounds (--stream-max-bytes, --stream-max-age,
--deadletter-max-bytes), which `up` passes to every service it starts (whichever starts first
creates the streams). Checked through `loom.cli.main` both ways, without starting a process.

`up` once had no --launch-timeout-s (nor the retry flags): its scheduler always ran with
`serve`'s defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from typing import Any

import pytest

from loom import live_cli
from loom.cli import build_parser, main
from loom.serve import ServeOptions
from loom.up import UpOptions, up_commands
from services.runtime.stream_limits import GIB, MIB, StreamLimits
from services.scheduler.liveness import LivenessConfig, RetryPolicy

FAULT_FLAGS = ["--node-misses", "5", "--launch-timeout-s", "7.5", "--retry-attempts", "4",
               "--retry-base-s", "1.5", "--retry-factor", "3", "--retry-cap-s", "60",
               "--retry-jitter", "0.25", "--seed", "9"]


async def _done() -> int:
    return 0


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, ServeOptions]:
    """What each process `up` would start is given: its `loom serve` options by service.

    The stand-in for `up` runs when `cmd_up` builds its coroutine: before the event loop
    starts (so each child's `main` may run its own) and while the cluster file `up` wrote
    still exists. Every child's argv goes through `main`, as the child's would."""
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


@pytest.mark.parametrize(("flags", "liveness", "retry"), [
    ([], LivenessConfig(), RetryPolicy()),  # `serve`'s defaults
    (FAULT_FLAGS, LivenessConfig(misses=5, launch_timeout_s=7.5),
     RetryPolicy(max_attempts=4, base_s=1.5, factor=3.0, cap_s=60.0, jitter=0.25, seed=9)),
    (["--launch-timeout-s", "0"], LivenessConfig(launch_timeout_s=0.0), RetryPolicy()),
    (["--launch-timeout-s", "0.1"], LivenessConfig(launch_timeout_s=0.1), RetryPolicy()),
], ids=["defaults", "all", "never", "fraction"])
def test_the_scheduler_up_starts_gets_the_fault_flags(
        started: dict[str, ServeOptions], flags: list[str], liveness: LivenessConfig,
        retry: RetryPolicy) -> None:
    assert main([*UP, *flags]) == 0
    assert set(started) == {"scheduler", "placer", "metrics", "nodeagent"}
    assert (started["scheduler"].liveness, started["scheduler"].retry) == (liveness, retry)
    assert started["scheduler"].seed == retry.seed  # the policy's seed too, as `serve`'s


def test_up_with_a_cluster_passes_them_too(started: dict[str, ServeOptions]) -> None:
    assert main(["up", "--cluster", "n1g4", "--prometheus-port", "0", *FAULT_FLAGS]) == 0
    assert set(started) == {"scheduler", "placer", "metrics"}  # no local agents
    assert started["scheduler"].liveness.launch_timeout_s == 7.5


@pytest.mark.parametrize(("flags", "error"), [
    (["--node-misses", "0"], "liveness misses must be >= 1"),
    (["--launch-timeout-s", "-1"], "launch timeout must be >= 0 s"),
    (["--retry-factor", "0.5"], "retry needs base_s >= 0, factor >= 1"),
    (["--retry-jitter", "1"], "retry jitter must be in [0, 1)"),
])
def test_a_bad_value_fails_up_before_anything_starts(
        started: dict[str, ServeOptions], flags: list[str], error: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*UP, *flags]) == 2
    assert error in capsys.readouterr().err
    assert started == {}


def _options(parser: argparse.ArgumentParser, group: str) -> set[str]:
    (found,) = (g for g in parser._action_groups if g.title == group)
    return {flag for action in found._group_actions for flag in action.option_strings}


def test_up_has_every_fault_flag_serve_has() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve_flags = _options(sub.choices["serve"], "scheduler: node faults")
    assert "--launch-timeout-s" in serve_flags
    assert serve_flags == _options(sub.choices["up"], "scheduler: node faults")


# -- the streams' bounds --------------------------------------------------------------------
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


# -- start forecasts ------------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "every"), [
    ([], 60.0),  # `serve`'s default
    (["--forecast-every", "5"], 5.0),
    (["--forecast-every", "-1"], None),  # never
], ids=["default", "given", "never"])
def test_the_scheduler_up_starts_gets_forecast_every(
        started: dict[str, ServeOptions], flags: list[str], every: float | None) -> None:
    """`up` once had no --forecast-every: its scheduler always forecast every 60 s."""
    assert main([*UP, *flags]) == 0
    assert started["scheduler"].forecast_every_s == every
