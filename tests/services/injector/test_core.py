"""The injector: a sequence is sorted, a stream is taken as it comes (in order, one job
ahead), and a stream that goes back in time stops injection with the culprit named."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from schemas.job import JobSpec, SubmitJob
from services.injector.core import InjectorCore
from services.runtime.effects import Publish, SetTimer
from tests.builders import cluster, make_job, simulate


def _jobs(*times: float) -> list[JobSpec]:
    return [make_job(f"j{i}").submit(t).build() for i, t in enumerate(times)]


def _drain(core: InjectorCore) -> list[tuple[float, str]]:
    """(arrival time, job id) of each submission, firing each armed timer in turn."""
    out: list[tuple[float, str]] = []
    armed = core.start(0.0)
    while armed:
        timer = armed[-1]
        assert isinstance(timer, SetTimer)
        effects = core.on_timer(timer.key, timer.at)
        pub = effects[0]
        assert isinstance(pub, Publish) and isinstance(pub.body, SubmitJob)
        out.append((timer.at, pub.body.job_id))
        armed = [e for e in effects if isinstance(e, SetTimer)]
    return out


class _Counted:
    """An iterable that counts how far it has been read."""

    def __init__(self, jobs: list[JobSpec]) -> None:
        self.jobs, self.read = jobs, 0

    def __iter__(self) -> Iterator[JobSpec]:
        for job in self.jobs:
            self.read += 1
            yield job


@pytest.mark.parametrize(("source", "expected"), [
    ("list", [(0.0, "j1"), (5.0, "j0"), (5.0, "j2")]),  # sorted, ties in given order
    ("stream", [(0.0, "j0"), (5.0, "j1"), (5.0, "j2")]),
])
def test_arrivals_in_submission_order(source: str, expected: list[tuple[float, str]]) -> None:
    jobs = _jobs(5.0, 0.0, 5.0) if source == "list" else _jobs(0.0, 5.0, 5.0)
    core = InjectorCore(jobs if source == "list" else iter(jobs))
    assert _drain(core) == expected
    assert core.done and core.error is None


def test_a_stream_is_read_one_job_ahead() -> None:
    stream = _Counted(_jobs(0.0, 1.0, 2.0, 3.0))
    core = InjectorCore(stream)
    assert stream.read == 1  # only the first arrival is known up front
    (timer,) = core.start(0.0)
    assert isinstance(timer, SetTimer)
    core.on_timer(timer.key, timer.at)
    assert stream.read == 2


def test_a_stream_out_of_order_stops_with_the_culprit_named() -> None:
    core = InjectorCore(iter(_jobs(0.0, 9.0, 4.0, 20.0)))
    assert [jid for _, jid in _drain(core)] == ["j0", "j1"]
    assert core.error is not None
    assert "'j2'" in core.error and "'j1'" in core.error and "submission order" in core.error


def test_simulating_a_stream_decides_as_the_list_does() -> None:
    jobs = [make_job(f"j{i}").gpus(1 + i % 4).runs_for(50 + 37 * (i % 5)).submit(10.0 * i)
            .build() for i in range(24)]
    listed = simulate(jobs, "srtf", cluster(2, 4))
    streamed = simulate(iter(jobs), "srtf", cluster(2, 4))
    assert streamed.summary["decision_digest"] == listed.summary["decision_digest"]
    assert streamed.summary["finished"] == listed.summary["finished"] == 24


def test_simulating_a_stream_out_of_order_is_an_error() -> None:
    jobs = [make_job("a").submit(5.0).build(), make_job("b").submit(1.0).build()]
    with pytest.raises(ValueError, match=r"'b' is submitted at 1\.0 s, before"):
        simulate(iter(jobs), "fifo")
