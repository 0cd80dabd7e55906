"""The metrics service's watch on the streams' fill: gauges, and a warning at 80 % of
max_bytes once per crossing (services/metrics/stream_usage.py)."""

from __future__ import annotations

import time

import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from schemas import subjects
from schemas.cluster import ClusterSpec
from services.metrics.core import MetricsCore
from services.metrics.prometheus import exposition, registry_for
from services.metrics.stream_usage import NEAR_FULL, StreamUsage, StreamWatch, crossing
from services.runtime.nats_live import NatsLiveBus
from services.runtime.natsserver import EmbeddedNats
from services.runtime.stream_limits import KIB, MIB, StreamLimits

MAX = 1000


def gauges(text: str) -> dict[tuple[str, str], float]:
    """(name, stream) → value of the stream gauges in an exposition."""
    return {(m.name, sample.labels["stream"]): sample.value
            for m in text_string_to_metric_families(text) if m.name.startswith("loom_stream")
            for sample in m.samples}


def usage(stored: int, max_bytes: int = MAX) -> StreamUsage:
    return StreamUsage("LOOM", stored, 1, max_bytes)


@pytest.mark.parametrize(("was_near", "stored", "max_bytes", "near", "warn"), [
    (False, 0, MAX, False, False),
    (False, 799, MAX, False, False),
    (False, 800, MAX, True, True),  # crosses 80 %: warn
    (True, 850, MAX, True, False),  # still above: no repeat
    (True, 1000, MAX, True, False),
    (True, 799, MAX, False, False),  # fell below: quiet, and re-armed
    (False, 900, MAX, True, True),  # crosses again: warn again
    (False, 10**12, -1, False, False),  # no limit: never near
    (False, 10**12, 0, False, False),
])
def test_the_warning_comes_once_per_crossing_of_80_percent(
        was_near: bool, stored: int, max_bytes: int, near: bool, warn: bool) -> None:
    assert NEAR_FULL == 0.8
    assert crossing(was_near, usage(stored, max_bytes)) == (near, warn)


def test_the_watch_logs_a_warning_at_each_upward_crossing_only() -> None:
    watch = StreamWatch(None, ["LOOM"])
    with capture_logs() as logs:
        for stored in (100, 810, 900, 990, 500, 700, 820, 830):
            watch.observe(usage(stored))
    warnings = [e for e in logs if e["event"] == "stream nearly full"]
    assert [(e["bytes"], e["percent"]) for e in warnings] == [(810, 81.0), (820, 82.0)]
    assert warnings[0]["when_full"].startswith("refuses new messages")
    assert watch.latest["LOOM"].bytes == 830


@pytest.mark.nats
async def test_the_metrics_watch_polls_both_streams_into_gauges_and_warns(
        nats_server: EmbeddedNats) -> None:
    bus = await NatsLiveBus.connect(nats_server.url, service="metrics", now=time.time,
                                    limits=StreamLimits(max_bytes=1 * MIB))
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        watch = StreamWatch(bus.js, [bus.stream, bus.deadletters])
        registry = registry_for(MetricsCore(4), ClusterSpec.uniform(1, 1, 4), watch.latest)
        with capture_logs() as logs:
            await watch.poll()
            for _ in range(14):  # 14 × 60 KiB: past 80 % of 1 MiB
                await js.publish(subjects.JOB_SUBMIT, b"j" * (60 * KIB))
            await js.publish(subjects.deadletter("x"), b"d")
            await watch.poll()
            await watch.poll()
        warned = [e for e in logs if e["event"] == "stream nearly full"]
        assert [e["stream"] for e in warned] == [subjects.STREAM]
        got = gauges(exposition(registry))
        info = await js.stream_info(subjects.STREAM)
        assert got[("loom_stream_bytes", "LOOM")] == info.state.bytes > 0.8 * MIB
        assert got[("loom_stream_max_bytes", "LOOM")] == MIB
        assert got[("loom_stream_messages", "LOOM")] == 14
        assert got[("loom_stream_messages", "LOOM_DEADLETTER")] == 1
        assert got[("loom_stream_max_bytes", "LOOM_DEADLETTER")] == 256 * MIB
        watch.start()  # the service's loop: polls until stopped
        await watch.stop()
    finally:
        await nc.close()
        await bus.close()
