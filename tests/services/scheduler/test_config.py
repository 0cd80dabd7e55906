"""A scheduler's configuration: its times are floats, and bad values are refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loom.simulate import SimConfig, run_simulation
from services.scheduler.config import SchedulerConfig
from tests.builders import cluster
from tests.integration.pipeline import generated_trace

TIMES = ("round_s", "forecast_every_s", "forecast_horizon_s", "queue_status_every_s")


@pytest.mark.parametrize("name", TIMES)
@pytest.mark.parametrize("value", [360, np.int64(360), np.float64(360.0), 360.0])
def test_times_are_plain_floats(name: str, value: Any) -> None:
    # A time prints with repr in the decision digest: 360, np.float64(360.0) and 360.0 must
    # read the same, run from source or compiled.
    got = getattr(SchedulerConfig(**{name: value}), name)
    assert type(got) is float and got == 360.0


@pytest.mark.parametrize(("fields", "message"), [
    ({"round_s": 0}, "round_s must be a positive number of seconds, not 0.0"),
    ({"round_s": -5.0}, "round_s must be a positive number of seconds"),
    ({"round_s": float("nan")}, "round_s must be a positive number of seconds, not nan"),
    ({"round_s": float("inf")}, "round_s must be a positive number of seconds, not inf"),
    ({"round_s": "360"}, "round_s must be a number of seconds, not '360'"),
    ({"round_s": True}, "round_s must be a number of seconds, not True"),
    ({"round_s": None}, "round_s must be a number of seconds, not None"),
    ({"forecast_horizon_s": None}, "forecast_horizon_s must be a number of seconds"),
    ({"forecast_every_s": "1m"}, "forecast_every_s must be a number of seconds, not '1m'"),
    ({"forecast_every_s": -1}, "forecast_every_s must be 0 or more"),
    ({"queue_status_every_s": -1.0}, "queue_status_every_s must be 0 or more"),
    ({"replan": "hourly"}, "replan must be 'event', 'round' or 'slot', not 'hourly'"),
    ({"placement": "nearest"}, "unknown placement 'nearest'"),
])
def test_bad_values_are_refused_by_name(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SchedulerConfig(**fields)


@pytest.mark.parametrize("name", ["forecast_every_s", "queue_status_every_s"])
def test_optional_cadences_may_be_none(name: str) -> None:
    fields: dict[str, Any] = {name: None}
    assert getattr(SchedulerConfig(**fields), name) is None


async def test_an_integer_round_decides_and_digests_as_its_float() -> None:
    jobs = generated_trace(5, 16)
    digests = set()
    for round_s in (120, 120.0):
        cfg = SimConfig(policy="fifo", jobs=jobs, cluster=cluster(2, 4), round_s=round_s)
        digests.add((await run_simulation(cfg)).summary["decision_digest"])
    assert len(digests) == 1
