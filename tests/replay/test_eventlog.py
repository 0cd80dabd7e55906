"""The event log file: corrupt, truncated or foreign files are refused naming record and why."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from loom.cli import main
from loom.eventlog import EventLogError, EventLogWriter, RunInfo, read_log
from tests.replay.mutations import spans

RUN = RunInfo(policy="fifo", cluster=None)


def _plain_log(path: Path, n: int = 3) -> bytes:
    writer = EventLogWriter(path, "sim", RUN)
    for i in range(n):
        writer.record(i + 1, "loom.jobs.submit", float(i), f"m{i}", b"\x80" * (5 + i))
    writer.close("ab" * 32)
    return path.read_bytes()


def _pack(*objs: object) -> bytes:
    return b"".join(msgpack.packb(o, use_bin_type=True) for o in objs)


HEADER = {"format": "loom-eventlog", "version": 1, "source": "sim",
          "run": {"policy": "fifo", "cluster": None}}


def _trailer_size(data: bytes) -> int:
    """Bytes of the last record (the trailer) of a raw log."""
    start, end = spans(data)[-1]
    return end - start


GOOD = {"seq": 1, "subject": "loom.jobs.submit", "time": 0.0, "msg_id": None, "data": b"x"}

# name → (bytes of the file from a 3-record log's bytes, record named, words in the reason)
CORRUPTIONS: list[tuple[str, Callable[[bytes], bytes], int | None, str]] = [
    ("cut inside a record", lambda b: b[:-_trailer_size(b) - 3], 3,
     "cut short in the middle of a record"),
    ("cut inside the trailer", lambda b: b[:-3], 4, "cut short in the middle of a record"),
    ("no trailer", lambda b: b[:-_trailer_size(b)], 4, "truncated: no trailer after record 3"),
    ("empty", lambda b: b"", None, "empty file"),
    ("not a log", lambda b: b"hello world, not msgpack at all", 0, "not a loom-eventlog"),
    ("other version", lambda b: _pack({**HEADER, "version": 9}), 0, "unsupported version 9"),
    ("record missing a field", lambda b: _pack(HEADER, {k: v for k, v in GOOD.items()
                                                        if k != "subject"}), 1,
     "missing field 'subject'"),
    ("record field of the wrong type", lambda b: _pack(HEADER, {**GOOD, "time": "soon"}), 1,
     "field 'time' has type str"),
    ("records out of order", lambda b: _pack(HEADER, {**GOOD, "seq": 5}, {**GOOD, "seq": 4}),
     2, "sequence 4 after 5"),
    ("trailer count wrong", lambda b: _pack(HEADER, GOOD, {"end": 2}), 2,
     "trailer counts 2 messages, the file holds 1"),
    ("data after the trailer", lambda b: _pack(HEADER, {"end": 0}, GOOD), 2,
     "data after the trailer"),
    ("unknown header field", lambda b: _pack({**HEADER, "run": {"policy": "x", "colour": 1}}),
     0, "unknown run fields ['colour']"),
]


@pytest.mark.parametrize(("make", "record", "why"), [c[1:] for c in CORRUPTIONS],
                         ids=[c[0] for c in CORRUPTIONS])
def test_a_bad_file_names_the_record_and_why(tmp_path: Path, make: Callable[[bytes], bytes],
                                            record: int | None, why: str) -> None:
    good = _plain_log(tmp_path / "good.eventlog")
    bad = tmp_path / "bad.eventlog"
    bad.write_bytes(make(good))
    with pytest.raises(EventLogError) as info:
        read_log(bad)
    assert info.value.record == record
    assert why in str(info.value) and str(bad) in str(info.value)


def test_gzip_cut_short_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "log.eventlog.gz"
    _plain_log(path, n=200)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(EventLogError, match="compressed data is corrupt or cut short"):
        read_log(path)


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    plain = _plain_log(tmp_path / "a.eventlog")
    (tmp_path / "b.log").write_bytes(gzip.compress(plain))
    log = read_log(tmp_path / "b.log")
    assert [r.msg_id for r in log.records] == ["m0", "m1", "m2"]
    assert log.decision_digest == "ab" * 32 and log.run == RUN


def test_replay_cli_refuses_a_truncated_log_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _plain_log(tmp_path / "good.eventlog")
    (tmp_path / "cut.eventlog").write_bytes(good[:-30])
    assert main(["replay", str(tmp_path / "cut.eventlog")]) == 2
    err = capsys.readouterr().err
    assert "cut.eventlog, record 4" in err and "cut short" in err  # inside the trailer


def test_a_log_closed_as_incomplete_reads_as_cut_short(tmp_path: Path) -> None:
    writer = EventLogWriter(tmp_path / "failed.eventlog.gz", "sim", RUN)
    writer.record(1, "loom.jobs.submit", 0.0, None, b"{}")
    writer.close("cd" * 32, complete=False)  # the run failed: no trailer
    with pytest.raises(EventLogError, match="truncated: no trailer after record 1"):
        read_log(tmp_path / "failed.eventlog.gz")


def test_sim_refuses_a_log_path_it_cannot_write_before_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    rc = main(["sim", "--trace", "tiresias/60_job", "--cluster", "n8g8", "--policy", "fifo",
               "--out", str(tmp_path / "out"), "--log", str(tmp_path / "file" / "x.eventlog")])
    assert rc == 2 and "--log" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
