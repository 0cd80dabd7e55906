"""A sim log recorded with start forecasts on replays, forecasts skipped (they are
observations, not decisions), to the digest of the same run without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.eventlog import read_log
from loom.replay.cores import fresh_cores
from loom.replay.engine import recorded_envelope, replay
from schemas.events import StartForecast
from tests.builders import cluster, make_job, simulate


@pytest.mark.parametrize("policy", ["srtf", "tiresias"])
def test_a_log_with_forecasts_replays_to_the_digest_without_them(tmp_path: Path,
                                                                 policy: str) -> None:
    jobs = [make_job(f"j{i}").gpus(1 + i % 3).runs_for(200.0 + 37 * i).submit(15.0 * i).build()
            for i in range(12)]
    path = tmp_path / "forecasts.eventlog.gz"
    on = simulate(jobs, policy, cluster(nodes=1, gpus_per_node=4), log=path,
                  forecast_every_s=0.0)
    off = simulate(jobs, policy, cluster(nodes=1, gpus_per_node=4))
    log = read_log(path)
    assert any(isinstance(getattr(recorded_envelope(r), "body", None), StartForecast)
               for r in log.records)
    result = replay(log, fresh_cores(log))
    assert result.ok, result.divergence.render() if result.divergence else ""
    assert result.digest == on.summary["decision_digest"] == off.summary["decision_digest"]
