"""Replay of event logs: bundled logs reproduce, altered logs diverge where they were altered."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel

from loom.eventlog import EventLog, Record, read_log, write_log
from loom.replay.cores import fresh_cores
from loom.replay.engine import ReplayResult, check_digest, recorded_envelope, replay
from loom.simulate import SimConfig, run_simulation
from schemas.codec import encode
from schemas.events import JobTransitionV1, NodeCommand, PlanDecided
from services.runtime.natsserver import EmbeddedNats
from tests.builders import cluster, make_job, simulate

LOGS = Path(__file__).resolve().parents[2] / "traces" / "logs"
BUNDLED = sorted(LOGS.glob("*.eventlog.gz"))


def run_replay(log: EventLog) -> ReplayResult:
    return replay(log, fresh_cores(log))


def test_there_are_bundled_logs_and_each_is_small() -> None:
    assert len(BUNDLED) >= 5
    assert {read_log(p).source for p in BUNDLED} == {"sim", "live"}
    for path in BUNDLED:
        assert path.stat().st_size < 1 << 20, path.name


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.name.split(".")[0])
def test_bundled_log_replays_to_its_digest(path: Path) -> None:
    log = read_log(path)
    result = run_replay(log)
    assert result.divergence is None, result.divergence.render()
    if log.source == "sim":
        assert result.digest == log.decision_digest  # the digest the recorded run printed
    assert result.decisions["scheduler"] > 0 and result.decisions["placer"] > 0
    check_digest(log, result)


def _sim_log(tmp_path: Path, name: str, policy: str, **kwargs: object) -> tuple[Path, str]:
    jobs = [make_job(f"j{i}").gpus(1 + i % 3).runs_for(200.0 + 37 * i).submit(15.0 * i).build()
            for i in range(12)]
    path = tmp_path / name
    result = simulate(jobs, policy, cluster(nodes=1, gpus_per_node=4), log=path, **kwargs)
    return path, str(result.summary["decision_digest"])


@pytest.mark.parametrize(("policy", "kwargs"), [
    ("srtf", {}),
    ("tiresias", {"overhead": "flat:30"}),
    ("fifo", {"round_s": 100.0}),
])
def test_a_fresh_sim_log_replays_and_records_identically_twice(
        tmp_path: Path, policy: str, kwargs: dict[str, object]) -> None:
    first, digest = _sim_log(tmp_path, "a.eventlog.gz", policy, **kwargs)
    second, _ = _sim_log(tmp_path, "b.eventlog.gz", policy, **kwargs)
    assert first.read_bytes() == second.read_bytes()  # same run, same bytes
    log = read_log(first)
    assert log.decision_digest == digest
    result = run_replay(log)
    assert result.ok and result.digest == digest


# -- altered logs ---------------------------------------------------------------------------

Edit = Callable[[BaseModel], BaseModel]


def _alter(log: EventLog, kind: type[BaseModel], nth: int, edit: Edit) -> tuple[EventLog, int]:
    """`log` with the nth message of body type `kind` edited; returns it and that record's
    index."""
    seen = 0
    for i, rec in enumerate(log.records):
        env = recorded_envelope(rec)
        if env is None or not isinstance(env.body, kind):
            continue
        if seen == nth:
            changed = env._replace(body=edit(env.body))
            records = list(log.records)
            records[i] = dataclasses.replace(rec, data=encode(changed))
            return dataclasses.replace(log, records=records), rec.index
        seen += 1
    raise AssertionError(f"log has fewer than {nth + 1} {kind.__name__}")


def _later(env_time_shift: float) -> Callable[[Record], Record]:
    return lambda rec: dataclasses.replace(rec, time=rec.time + env_time_shift)


ALTERATIONS: list[tuple[str, type[BaseModel], int, Edit, str, str]] = [
    ("transition cause", JobTransitionV1, 7,  # the bundled logs are of version 1
     lambda b: b.model_copy(update={"cause": "tampered"}), "scheduler", "body differs: cause"),
    ("plan running count", PlanDecided, 5,
     lambda b: b.model_copy(update={"running": b.running + 1}), "scheduler",
     "body differs: running"),
    ("placer command cycle", NodeCommand, 3,
     lambda b: b.model_copy(update={"cycle": b.cycle + 100}), "placer", "body differs: cycle"),
]


@pytest.mark.parametrize(("kind", "nth", "edit", "core", "why"),
                         [a[1:] for a in ALTERATIONS], ids=[a[0] for a in ALTERATIONS])
def test_an_altered_decision_is_reported_at_that_record(
        kind: type[BaseModel], nth: int, edit: Edit, core: str, why: str) -> None:
    log = read_log(LOGS / "tiresias-60job.eventlog.gz")
    altered, index = _alter(log, kind, nth, edit)
    result = run_replay(altered)
    d = result.divergence
    assert d is not None
    assert (d.core, d.record.index if d.record else None) == (core, index)
    assert d.why.startswith(why)
    assert d.recorded is not None and d.replayed is not None
    text = d.render()
    assert f"at record {index}" in text and "recorded:" in text and "replayed:" in text


def test_a_changed_input_time_diverges_at_the_next_decision_and_shows_the_input() -> None:
    log = read_log(LOGS / "tiresias-60job.eventlog.gz")
    # The 10th submission arrives 7 s later than recorded: the scheduler's next decision (its
    # admission) now carries another time.
    subs = [i for i, r in enumerate(log.records) if r.subject == "loom.jobs.submit"]
    i = subs[9]
    records = list(log.records)
    records[i] = dataclasses.replace(records[i], time=records[i].time + 7.0)
    result = run_replay(dataclasses.replace(log, records=records))
    d = result.divergence
    assert d is not None and d.core == "scheduler" and d.why.startswith("time")
    assert d.record is not None and d.record.index > records[i].index
    assert any(inp.record.index == records[i].index and inp.env is not None
               for inp in d.inputs)


def test_a_dropped_decision_is_reported() -> None:
    log = read_log(LOGS / "srtf-60job-rounds.eventlog.gz")
    plans = [i for i, r in enumerate(log.records)
             if (e := recorded_envelope(r)) is not None and isinstance(e.body, PlanDecided)]
    dropped = log.records[plans[2]]
    records = [r for r in log.records if r is not dropped]
    result = run_replay(dataclasses.replace(log, records=records))
    d = result.divergence
    assert d is not None and d.core == "scheduler"
    assert d.replayed is not None and isinstance(d.replayed.body, PlanDecided)
    assert d.record is not None and d.record.index > dropped.index


def test_write_log_round_trips(tmp_path: Path) -> None:
    log = read_log(LOGS / "elasticflow-resnet-cifar.eventlog.gz")
    write_log(log, tmp_path / "copy.eventlog")
    again = read_log(tmp_path / "copy.eventlog")
    assert [dataclasses.astuple(r) for r in again.records] == \
        [dataclasses.astuple(r) for r in log.records]
    assert (again.run, again.source, again.decision_digest) == \
        (log.run, log.source, log.decision_digest)


@pytest.mark.nats
async def test_memory_and_jetstream_runs_record_the_same_log(
        tmp_path: Path, nats_server: EmbeddedNats) -> None:
    jobs = [make_job(f"j{i}").gpus(1 + i % 2).runs_for(90.0 + 11 * i).submit(10.0 * i).build()
            for i in range(8)]
    paths = {}
    for bus, url in (("memory", None), ("nats", nats_server.url)):
        paths[bus] = tmp_path / f"{bus}.eventlog"
        cfg = SimConfig(policy="srtf", jobs=jobs, cluster=cluster(nodes=1, gpus_per_node=2),
                        bus=bus, nats_url=url, log=paths[bus])  # type: ignore[arg-type]
        await run_simulation(cfg)
    assert paths["memory"].read_bytes() == paths["nats"].read_bytes()
    assert run_replay(read_log(paths["nats"])).ok


@pytest.mark.parametrize(("name", "diverges"), [
    ("live-srtf-n2g2.eventlog.gz", False),  # a live stream is cut wherever it was exported
    ("tiresias-60job.eventlog.gz", True),  # a simulation's log holds the whole run
])
def test_a_log_cut_before_a_reply_to_its_last_input(name: str, diverges: bool) -> None:
    """The log stops just before the placer's last command: the fresh placer still makes it.
    A live log reports it as past the log's end; a sim log as a decision it does not have."""
    log = read_log(LOGS / name)
    commands = [i for i, r in enumerate(log.records)
                if (e := recorded_envelope(r)) is not None and isinstance(e.body, NodeCommand)]
    result = run_replay(dataclasses.replace(log, records=log.records[:commands[-1]]))
    if diverges:
        d = result.divergence
        assert d is not None and d.core == "placer" and d.record is None
        assert d.why == "the fresh core made a decision the log does not have"
    else:
        assert result.ok and result.cut_off == {"placer": 1}
        assert result.decisions["placer"] == len(commands) - 1
    assert run_replay(log).cut_off == {}  # whole, nothing is past its end
