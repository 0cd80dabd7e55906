"""Damaged event logs: a version-2 log either reads back exactly or is refused naming the file
and the record, and `loom replay` exits 2 on it, never 1 (a divergence) and never with a
traceback. Version-1 logs (the bundled ones) still read and replay as they did."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import math
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.cli import main
from loom.eventlog import EventLog, EventLogError, read_log, write_log
from loom.replay.engine import check_payloads
from tests.builders import cluster, make_job, simulate
from tests.replay.mutations import (
    BYTE_KINDS,
    KINDS,
    Mutation,
    gzipped,
    mutate,
    spans,
)

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "traces" / "logs"
TIRESIAS_LOG = LOGS / "tiresias-60job.eventlog.gz"
TIRESIAS_DIGEST = "751a0e838470460d379c42756625d899358dc6a0108068e5671a07a0475d914e"


@dataclasses.dataclass(frozen=True)
class Small:
    """A small simulated run's log (32 messages), as written raw and gzipped."""

    raw: bytes
    gz: bytes
    log: EventLog
    work: Path  # where the tests write damaged copies

    def __repr__(self) -> str:  # hypothesis prints it with a failing example
        return f"Small({len(self.raw)} bytes raw, {len(self.gz)} gzipped, in {self.work})"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Small:
    work = tmp_path_factory.mktemp("damaged")
    jobs = [make_job(f"j{i}").gpus(1 + i % 2).runs_for(60.0 + 25 * i).submit(10.0 * i).build()
            for i in range(4)]
    for name in ("small.eventlog", "small.eventlog.gz"):
        simulate(jobs, "srtf", cluster(nodes=1, gpus_per_node=2), log=work / name)
    return Small((work / "small.eventlog").read_bytes(), (work / "small.eventlog.gz").read_bytes(),
                 read_log(work / "small.eventlog"), work)


def _same(a: EventLog, b: EventLog) -> bool:
    return dataclasses.replace(a, path=b.path) == b


def _cli(*argv: str) -> tuple[int, str]:
    """`loom ARGV` in-process: (exit code, stderr). An exception escaping main fails the test:
    that is a traceback."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, err.getvalue()


def _check_damaged(path: Path, data: bytes, original: EventLog) -> None:
    """The property: reading refuses the file naming it, or returns the original log (a
    mutation that changed nothing the log says); replay exits 2 or 0 accordingly."""
    path.write_bytes(data)
    try:
        log = read_log(path)
    except EventLogError as exc:
        assert str(exc).startswith(str(path))
        intact = False
    else:
        assert _same(log, original)
        intact = True
    rc, err = _cli("replay", str(path))
    assert rc == (0 if intact else 2), err
    if not intact:
        assert str(path) in err and "Traceback" not in err


def mutations(kinds: tuple[str, ...]) -> st.SearchStrategy[Mutation]:
    return st.tuples(st.sampled_from(kinds), st.integers(0, 1 << 32), st.integers(0, 1 << 32),
                     st.binary(min_size=1, max_size=16))


DAMAGE = settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])


@DAMAGE
@given(mutation=mutations(KINDS))
def test_a_damaged_raw_log_is_refused_or_reads_identically(small: Small,
                                                           mutation: Mutation) -> None:
    _check_damaged(small.work / "raw.eventlog", mutate(small.raw, mutation), small.log)


@DAMAGE
@given(mutation=mutations(BYTE_KINDS))
def test_a_damaged_gzip_file_is_refused_or_reads_identically(small: Small,
                                                             mutation: Mutation) -> None:
    _check_damaged(small.work / "bytes.eventlog.gz", mutate(small.gz, mutation), small.log)


@DAMAGE
@given(mutation=mutations(KINDS))
def test_damage_inside_a_valid_gzip_stream_is_refused_or_reads_identically(
        small: Small, mutation: Mutation) -> None:
    """Damaged before compression, so gzip's own CRC holds and only the log's checks can
    tell."""
    _check_damaged(small.work / "inner.eventlog.gz", gzipped(mutate(small.raw, mutation)),
                   small.log)


def test_the_untouched_small_log_replays_ok(small: Small) -> None:
    assert small.log.version == 2
    assert _cli("replay", str(small.work / "small.eventlog.gz")) == (0, "")


# -- where the chain breaks ---------------------------------------------------------------

@pytest.mark.parametrize(("mutation", "record"), [
    (("swap", 3, 5, b""), 3),  # the first record out of place
    (("delete", 4, 0, b""), 4),  # its successor now stands there
    (("duplicate", 6, 0, b""), 7),  # the copy
    (("delete", 0, 0, b""), 0),  # the header: the first message is no header
])
def test_moved_records_are_named_at_the_first_one_out_of_place(
        small: Small, mutation: Mutation, record: int) -> None:
    path = small.work / "moved.eventlog"
    path.write_bytes(mutate(small.raw, mutation))
    with pytest.raises(EventLogError) as info:
        read_log(path)
    assert info.value.record == record
    assert record == 0 or "checksum mismatch" in info.value.why


def test_a_flipped_bit_in_a_payload_is_named_with_its_record(small: Small) -> None:
    end = spans(small.raw)[10][1]
    path = small.work / "flipped.eventlog"
    # 20 bytes before its end: in `data`, before the `crc` entry (at most 9 bytes).
    path.write_bytes(mutate(small.raw, ("flip", end - 20, 0, b"")))
    with pytest.raises(EventLogError, match="record 10: checksum mismatch"):
        read_log(path)


# -- the format, as docs/replay.md states it ------------------------------------------------

def _objects(data: bytes) -> list[dict[Any, Any]]:
    return list(msgpack.Unpacker(io.BytesIO(data), raw=False, strict_map_key=False))


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def _seal(contents: list[dict[Any, Any]]) -> bytes:
    """A version-2 file of these records (the last is the trailer), sealed as the format says:
    each `crc` is the CRC-32 of the record's other fields continued from the previous one."""
    crc, out = 0, b""
    for content in contents:
        crc = zlib.crc32(_pack(content), crc)
        out += _pack({**content, "crc": crc})
    return out


def _contents(data: bytes) -> list[dict[Any, Any]]:
    return [{k: v for k, v in obj.items() if k != "crc"} for obj in _objects(data)]


def test_the_checks_are_computed_as_documented(small: Small) -> None:
    contents = _contents(small.raw)
    assert _seal(contents) == small.raw
    sha = hashlib.sha256(b"".join(_pack(c) for c in contents[:-1])).hexdigest()
    assert contents[-1] == {"end": 32, "decision_digest": small.log.decision_digest,
                            "sha256": sha}
    assert contents[0]["version"] == 2 and gzip.decompress(small.gz) == small.raw


Edit = Callable[[list[dict[Any, Any]]], None]


def _set(index: int, key: Any, value: Any) -> Edit:
    def edit(contents: list[dict[Any, Any]]) -> None:
        contents[index if index >= 0 else len(contents) + index][key] = value
    return edit


def _set_run(key: str, value: Any) -> Edit:
    def edit(contents: list[dict[Any, Any]]) -> None:
        contents[0]["run"][key] = value
    return edit


# Well-sealed files whose content is wrong: a writer's bug, or a file forged with its checks
# recomputed. The checks vouch for the bytes, not the meaning, so every field is checked too.
MALFORMED: list[tuple[str, Edit, int, str]] = [
    ("data a map", _set(3, "data", {"x": 1}), 3, "field 'data' has type dict"),
    ("time NaN", _set(3, "time", math.nan), 3, "time nan is not a finite number"),
    ("time goes back", _set(3, "time", -1.0), 3, "a simulated clock does not go back"),
    ("seq a bool", _set(1, "seq", True), 1, "field 'seq' has type bool"),
    ("version True", _set(0, "version", True), 0, "unsupported version True"),
    ("seed a string", _set_run("seed", "7"), 0, "run field 'seed' has type str"),
    ("round_s zero", _set_run("round_s", 0.0), 0, "'round_s' is 0.0"),
    ("cluster a list", _set_run("cluster", [1]), 0, "run field 'cluster' has type list"),
    ("non-string key", _set(2, 7, b"x"), 2, "unknown fields [7]"),
    ("sha256 wrong", _set(-1, "sha256", "0" * 64), 33, "the trailer says 0000"),
    ("count a float", _set(-1, "end", 32.0), 33, "field 'end' has type float"),
    ("digest a map", _set(-1, "decision_digest", {}), 33,
     "field 'decision_digest' has type dict"),
]


@pytest.mark.parametrize(("edit", "record", "why"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_a_well_sealed_but_malformed_record_is_refused(small: Small, edit: Edit, record: int,
                                                       why: str) -> None:
    contents = _contents(small.raw)
    edit(contents)
    path = small.work / "malformed.eventlog"
    path.write_bytes(_seal(contents))
    with pytest.raises(EventLogError) as info:
        read_log(path)
    assert info.value.record == record and why in info.value.why
    rc, err = _cli("replay", str(path))
    assert rc == 2 and f"record {record}: " in err


def test_a_map_where_a_key_should_be_is_refused(small: Small) -> None:
    """Reading it used to raise TypeError (unhashable type: 'dict') from the unpacker."""
    path = small.work / "key.eventlog"
    path.write_bytes(small.raw[:spans(small.raw)[1][0]] + b"\x81\x80\x01")
    with pytest.raises(EventLogError, match=r"record 1: not valid msgpack .*unhashable"):
        read_log(path)


def test_a_what_if_on_a_damaged_log_exits_2(small: Small) -> None:
    path = small.work / "whatif.eventlog.gz"
    path.write_bytes(gzipped(mutate(small.raw, ("swap", 5, 9, b""))))
    rc, err = _cli("replay", str(path), "--policy", "fifo")
    assert rc == 2 and "record 5: checksum mismatch" in err


@pytest.mark.parametrize("mutation", [("flip", 4000, 3, b""), ("truncate", 9000, 0, b""),
                                      ("swap", 2, 20, b""), ("overwrite", 77, 0, b"\xc1\xc1")])
def test_the_loom_command_exits_2_without_a_traceback(small: Small,
                                                      mutation: Mutation) -> None:
    path = small.work / "sub.eventlog"
    path.write_bytes(mutate(small.raw, mutation))
    proc = subprocess.run([sys.executable, "-m", "loom.cli", "replay", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and f"{path}, record " in proc.stderr


# -- version 1 ----------------------------------------------------------------------------

def test_a_bundled_version_1_log_reads_and_replays_ok() -> None:
    log = read_log(TIRESIAS_LOG)
    assert log.version == 1 and len(log.records) == 517
    assert log.decision_digest == TIRESIAS_DIGEST
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["replay", str(TIRESIAS_LOG)]) == 0
    assert f"decision_digest {TIRESIAS_DIGEST}" in out.getvalue()
    for path in LOGS.glob("*.eventlog.gz"):
        bundled = read_log(path)
        # Recorded before logs carried versions (version 1), or re-recorded since (version 2).
        assert (bundled.version, bundled.versions is None) in ((1, True), (2, False))
        check_payloads(bundled)  # every sim log's payloads decode


def test_rewriting_a_version_1_log_writes_version_2_with_the_same_content(
        tmp_path: Path) -> None:
    old = read_log(TIRESIAS_LOG)
    write_log(old, tmp_path / "v2.eventlog.gz")
    new = read_log(tmp_path / "v2.eventlog.gz")
    assert new.version == 2
    assert _same(dataclasses.replace(new, version=1), old)
    rc, _ = _cli("replay", str(tmp_path / "v2.eventlog.gz"))
    assert rc == 0


def _v1_objects() -> list[dict[Any, Any]]:
    return _objects(gzip.decompress(TIRESIAS_LOG.read_bytes()))


def test_a_version_1_header_carrying_a_checksum_is_refused(tmp_path: Path) -> None:
    """A version-2 header whose version byte was damaged to 1 must not read unchecked."""
    objs = _v1_objects()
    objs[0]["crc"] = 12345
    path = tmp_path / "v1.eventlog"
    path.write_bytes(b"".join(map(_pack, objs)))
    with pytest.raises(EventLogError, match="record 0: header: version 1 has no checksums"):
        read_log(path)


def test_a_version_1_sim_log_with_an_undecodable_payload_exits_2(tmp_path: Path) -> None:
    """Version 1 has no checksums, but a simulation records only envelopes: a payload that
    does not decode was damaged, and replaying it would report a false divergence."""
    objs = _v1_objects()
    objs[40]["data"] = objs[40]["data"][:-2]
    path = tmp_path / "v1.eventlog"
    path.write_bytes(b"".join(map(_pack, objs)))
    log = read_log(path)
    with pytest.raises(EventLogError, match="record 40: payload does not decode"):
        check_payloads(log)
    rc, err = _cli("replay", str(path))
    assert rc == 2 and "record 40: payload does not decode" in err
    check_payloads(read_log(TIRESIAS_LOG))  # the intact log passes
