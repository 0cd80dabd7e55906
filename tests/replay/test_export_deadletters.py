"""`loom log export` merges the dead-letter stream into the log, so a live run in which a
core refused an input replays OK (replay checks a core's dead letters as decisions)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from loom.cli import main
from loom.eventlog import EventLogError, EventLogWriter, Record, RunInfo, read_log, write_log
from loom.replay.engine import CoreReplay, Decision
from loom.replay.export import Row, merge_by_time
from loom.serve import ServeOptions, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode, encode
from schemas.events import DEAD_LETTER_KEEP, DeadLetter, envelope
from services.runtime.bus import MSG_ID
from services.runtime.natsserver import EmbeddedNats

CLUSTER = ClusterSpec.uniform(1, 1, 2, gpu_type="fake")


def row(seq: int, time: float, subject: str = "loom.jobs.submit") -> Row:
    return Row(seq, subject, time, None, b"")


async def rows(items: list[Row]) -> AsyncIterator[Row]:
    for item in items:
        yield item


@pytest.mark.parametrize(("main_times", "side_times", "order"), [
    ([1, 2, 3], [], ["m1", "m2", "m3"]),
    ([], [1, 2], ["s1", "s2"]),
    ([1, 3, 5], [2, 4, 6], ["m1", "s1", "m2", "s2", "m3", "s3"]),
    ([1, 2], [2, 2], ["m1", "m2", "s1", "s2"]),  # a tie: the event stream's message first
    ([5, 1, 7], [3, 2], ["s1", "s2", "m1", "m2", "m3"]),  # each stream keeps its own order
])
async def test_merge_by_time_interleaves_two_streams_each_in_its_own_order(
        main_times: list[float], side_times: list[float], order: list[str]) -> None:
    events = [row(i, t) for i, t in enumerate(main_times, start=1)]
    dead = [row(i, t, "loom.deadletter.x") for i, t in enumerate(side_times, start=1)]
    merged = [r async for r in merge_by_time(rows(events), dead)]
    assert [("s" if r.subject.startswith("loom.deadletter") else "m") + str(r.seq)
            for r in merged] == order


def write(path: Path, source: str, records: list[tuple[int, str]]) -> None:
    writer = EventLogWriter(path, source, RunInfo(None, None),  # type: ignore[arg-type]
                            versions=None)
    for n, (seq, subject) in enumerate(records):
        writer.record(seq, subject, float(n), None, b"x")
    writer.close()


def test_a_live_log_counts_each_streams_sequence_apart(tmp_path: Path) -> None:
    merged = [(1, "loom.jobs.submit"), (1, "loom.deadletter.scheduler"),
              (2, "loom.jobs.submit"), (2, "loom.deadletter.bus"), (3, "loom.sched.plan")]
    write(tmp_path / "live.eventlog", "live", merged)
    assert [r.seq for r in read_log(tmp_path / "live.eventlog").records] == [1, 1, 2, 2, 3]
    write(tmp_path / "sim.eventlog", "sim", merged)  # a simulation has one stream
    with pytest.raises(EventLogError, match="record 2: sequence 1 after 1: out of order"):
        read_log(tmp_path / "sim.eventlog")
    back = [(1, "loom.jobs.submit"), (2, "loom.deadletter.x"), (2, "loom.jobs.submit"),
            (1, "loom.deadletter.x")]
    write(tmp_path / "back.eventlog", "live", back)  # within a stream it still must rise
    with pytest.raises(EventLogError, match="record 4: sequence 1 after 2: out of order"):
        read_log(tmp_path / "back.eventlog")


# -- a live run ------------------------------------------------------------------------------


def job(job_id: str, **extra: Any) -> bytes:
    return json.dumps({"job_id": job_id, "model": "resnet18", "gpus": 1, "iterations": 10**6,
                       "iteration_time_s": 1.0, **extra}).encode()


async def until(check: Any, what: str, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


async def run_and_export(url: str, out: Path) -> None:
    """A scheduler and a placer; a job, then a different job under its id (the scheduler
    core refuses it: a dead letter it publishes, with a cut payload), and a junk payload
    (the bus refuses it). Then `loom log export`."""
    stop = asyncio.Event()
    runs = [asyncio.create_task(serve(ServeOptions(s, url, CLUSTER, policy="fifo"), stop))
            for s in ("scheduler", "placer")]
    nc = await nats.connect(url)
    try:
        await until(lambda: _up(nc), "the services")
        js = nc.jetstream()
        await js.publish(subjects.JOB_SUBMIT, job("a"), headers={MSG_ID: "submit.a"})
        await js.publish(subjects.JOB_SUBMIT, job("a", model="custom",
                                                  command=["run", "x" * 3000, "y" * 3000]),
                         headers={MSG_ID: "submit.a-again"})
        await js.publish(subjects.JOB_SUBMIT, b"\xc1 junk", headers={MSG_ID: "junk.1"})

        async def two_dead_letters() -> bool:
            info = await js.stream_info(subjects.DEADLETTER_STREAM)
            return bool(info.state.messages == 2)
        await until(two_dead_letters, "two dead letters")
    finally:
        stop.set()
        assert await asyncio.gather(*runs) == [0, 0]
        await nc.close()
    spec = out.parent / "cluster.json"
    spec.write_text(CLUSTER.model_dump_json())
    argv = ["log", "export", "--nats-url", url, "--out", str(out), "--policy", "fifo",
            "--cluster", str(spec)]
    assert await asyncio.to_thread(main, argv) == 0


async def _up(nc: Any) -> bool:
    return {"scheduler", "placer"} <= set(await ping(nc, 0.1))


async def replay(log: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["replay", str(log)])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.nats
async def test_a_live_run_with_dead_letters_exports_and_replays_ok(
        nats_server: EmbeddedNats, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "live.eventlog.gz"
    await run_and_export(nats_server.url, log)
    records = read_log(log).records
    dead = [r for r in records if r.subject.startswith(subjects.DEADLETTER_PREFIX)]
    assert [r.seq for r in dead] == [1, 2]  # the dead-letter stream's own sequence
    letters = {decode(r.data).producer: decode(r.data).body for r in dead}
    refused = letters["scheduler"]
    assert isinstance(refused, DeadLetter) and "duplicate job id 'a'" in refused.reason
    assert len(refused.payload) == DEAD_LETTER_KEEP  # cut: the whole one is in LOOM
    junk = letters["bus"]
    assert isinstance(junk, DeadLetter) and junk.payload == b"\xc1 junk"
    # Merged by time: each dead letter comes after the submission it refuses.
    cause = next(i for i, r in enumerate(records) if r.msg_id == "submit.a-again")
    assert records.index(next(r for r in dead if decode(r.data).producer == "scheduler")) > cause

    code, out = await replay(log, capsys)
    assert code == 0 and out.startswith(f"OK {log}"), out

    # Without the dead letters the scheduler's refusal is a decision the log lacks, never
    # passed over: ahead of a later decision of the scheduler (the stack's timing decides), a
    # divergence; as its last, a decision after the end of a live log (which ends wherever it
    # was cut), counted and shown.
    bare = read_log(log)
    bare.records = [r for r in bare.records if r not in dead]
    write_log(bare, tmp_path / "bare.eventlog.gz")
    code, out = await replay(tmp_path / "bare.eventlog.gz", capsys)
    assert (code == 1 and "DIVERGED: scheduler" in out) or (
        code == 0 and "; 1 scheduler decisions after the log's end" in " ".join(out.split())
    ), out



class _Refuser:
    """A core for `CoreReplay.differs`: it is never fed."""

    name = "scheduler"

    def subscriptions(self) -> list[Any]:
        return []


@pytest.mark.parametrize("exact", [True, False])
def test_a_dead_letter_recorded_whole_matches_the_cut_one_replay_makes(exact: bool) -> None:
    """Logs recorded before dead letters were cut hold the whole payload: replay cuts the
    recorded one the same way before comparing (and a live log never compares payloads)."""
    whole = DeadLetter(subject="loom.job.submit.v1", service="scheduler", reason="no",
                       payload=bytes(range(256)) * 40)
    env = envelope(whole, event_id="e", occurred_at=5.0, producer="scheduler",
                   causation_id="submit.a")
    record = Record(3, 3, subjects.deadletter("scheduler"), 5.0, "e", encode(env))
    check = CoreReplay(_Refuser(), exact=exact)  # type: ignore[arg-type]
    cut = DeadLetter.kept(subject=whole.subject, service="scheduler", reason="no",
                          payload=whole.payload)
    assert check.differs(record, env, Decision(record.subject, cut, "submit.a", 5.0)) is None
    other = cut.model_copy(update={"payload": b"\xff" + cut.payload[1:]})
    why = check.differs(record, env, Decision(record.subject, other, "submit.a", 5.0))
    assert (why is not None) == exact  # payload bytes: compared in a sim log only
