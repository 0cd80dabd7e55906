"""A run's event log as a file: msgpack-framed records, optionally gzipped.

Format `loom-eventlog` version 2 (see docs/replay.md): a concatenation of msgpack maps.

- record 0, the header: `{"format": "loom-eventlog", "version": 2, "source": "sim" | "live",
  "run": {...}, "versions": {...}, "crc": ...}`; `run` holds what replay needs to rebuild the
  cores (policy, cluster spec, seed, overhead model, re-planning, placement, throughput
  profile, trace name); `versions` the versions of Python, Loom and the libraries whose
  results reach decisions (solvers, numpy, numba), absent in logs written before it existed
  (unknown);
- then one record per message the bus carried, in delivery order:
  `{"seq": stream sequence, "subject": ..., "time": the clock's time at publish,
  "msg_id": Nats-Msg-Id or nil, "data": the payload bytes as on the wire, "crc": ...}`.
  A live cluster keeps dead letters in a stream of their own, which `loom log export`
  merges in by time: in a live log, `seq` rises within each stream (`seq_stream`);
- last, the trailer: `{"end": number of messages, "decision_digest": hex or nil,
  "sha256": hex, "crc": ...}`. A file without it was cut short.

`crc` chains every record to the ones before it: the CRC-32 of the record's other fields
(msgpack-encoded, in file order), continued from the previous record's `crc`. So it is the
CRC-32 of everything the file says up to that record, and a damaged, removed, inserted or
reordered record breaks the chain at the first record out of place. The trailer's `sha256`
is the SHA-256 of the same encodings of the header and the messages, a check on the whole
log that random damage cannot pass by chance. Version 1 is the same without `crc` and
`sha256`; it is still read, with every field checked but nothing to catch damage that
leaves a well-formed file.

A file whose first two bytes are gzip's magic is read through gzip, whatever its name.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgpack

from loom.versions import Versions, running_versions
from schemas.subjects import DEADLETTER_PREFIX

FORMAT = "loom-eventlog"
VERSION = 2  # written
READABLE = (1, 2)
CHECK = "crc"
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16
_CRC_MAX = 1 << 32
DEADLETTER_SUBJECT_PREFIX = DEADLETTER_PREFIX + "."

Source = Literal["sim", "live"]

class EventLogError(ValueError):
    """A log that cannot be read; the message names the file, the record and why."""

    def __init__(self, path: Path | str, record: int | None, why: str) -> None:
        where = f"{path}" if record is None else f"{path}, record {record}"
        super().__init__(f"{where}: {why}")
        self.path = str(path)
        self.record = record
        self.why = why


_NONE = type(None)


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    """isinstance, except that a bool is no int (True == 1 would pass for a count)."""
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


@dataclass(frozen=True)
class RunInfo:
    """How the run was configured: enough to rebuild its scheduler and placer."""

    policy: str | None
    cluster: dict[str, Any] | None  # ClusterSpec.model_dump()
    seed: int = 0
    overhead: str = "none"
    round_s: float | None = None
    placement: str | None = None
    free_at_once: bool = False
    throughputs: str | None = None  # path of the throughput profile, if the run had one
    tenants: dict[str, Any] | None = None  # TenantsConfig.model_dump(): quotas and queues
    trace: str = "trace"
    run_id: str = "run"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Any, path: Path | str) -> RunInfo:
        if not isinstance(data, dict):
            raise EventLogError(path, 0, "header: 'run' must be a map")
        unknown = sorted(map(repr, set(data) - set(_RUN_FIELDS)))
        if unknown:
            raise EventLogError(path, 0, f"header: unknown run fields [{', '.join(unknown)}]")
        for name in ("policy", "cluster"):
            if name not in data:
                raise EventLogError(path, 0, f"header: run field {name!r} missing")
        for name, value in data.items():
            if not _typed(value, _RUN_FIELDS[name]):
                raise EventLogError(path, 0, f"header: run field {name!r} has type "
                                             f"{type(value).__name__}")
        round_s = data.get("round_s")
        if round_s is not None and not (math.isfinite(round_s) and round_s > 0):
            raise EventLogError(path, 0, f"header: run field 'round_s' is {round_s!r}, not a "
                                         "positive number of seconds")
        return cls(**data)


# The types a header's `run` fields may have (round_s: a float, or an int msgpack kept).
_RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "policy": (str, _NONE), "cluster": (dict, _NONE), "seed": (int,), "overhead": (str,),
    "round_s": (float, int, _NONE), "placement": (str, _NONE), "free_at_once": (bool,),
    "throughputs": (str, _NONE), "tenants": (dict, _NONE), "trace": (str,), "run_id": (str,),
}


@dataclass(frozen=True, slots=True)
class Record:
    index: int  # position in the file (the header is 0)
    seq: int
    subject: str
    time: float
    msg_id: str | None
    data: bytes


@dataclass
class EventLog:
    path: Path
    source: Source
    run: RunInfo
    records: list[Record] = field(default_factory=list)
    decision_digest: str | None = None
    versions: Versions | None = None  # None: recorded before logs carried them (unknown)
    version: int = VERSION  # of the file read: 1 has no checksums


class _Chain:
    """The running checks of a version-2 log: the CRC-32 of every record's content so far,
    and the SHA-256 of the header's and the messages' content (the trailer's `sha256`)."""

    def __init__(self) -> None:
        self.crc = 0
        self.sha = hashlib.sha256()
        self._packer = msgpack.Packer(use_bin_type=True)

    def seal(self, content: dict[Any, Any], *, hashed: bool = True) -> int:
        """The `crc` of a record holding `content`; moves the chain past it."""
        blob = self._packer.pack(content)
        self.crc = zlib.crc32(blob, self.crc)
        if hashed:
            self.sha.update(blob)
        return self.crc


class EventLogWriter:
    """Writes a log record by record, each with its link in the checksum chain; `close(digest)`
    writes the trailer. A `.gz` name gzips (with a zero timestamp, so the same run gives the
    same bytes).

    `versions`: the header's library versions, by default this process's; None writes none
    (unknown: a log rewritten from one that had none, or recorded by another process)."""

    def __init__(self, path: Path, source: Source, run: RunInfo,
                 versions: Mapping[str, str] | Literal["running"] | None = "running") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._raw = path.open("wb")
        self._out: BinaryIO = self._raw
        if path.suffix == ".gz":
            self._out = gzip.GzipFile(filename="", fileobj=self._raw, mode="wb",  # type: ignore[assignment]
                                      mtime=0)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._chain = _Chain()
        self.count = 0
        header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "source": source,
                                  "run": run.to_dict()}
        if versions == "running":
            versions = running_versions()
        if versions is not None:
            header["versions"] = dict(versions)
        self._write(header)

    def _write(self, content: dict[str, Any], *, hashed: bool = True) -> None:
        crc = self._chain.seal(content, hashed=hashed)
        self._out.write(self._packer.pack({**content, CHECK: crc}))

    def record(self, seq: int, subject: str, time: float, msg_id: str | None,
               data: bytes) -> None:
        self.count += 1
        self._write({"seq": seq, "subject": subject, "time": time, "msg_id": msg_id,
                     "data": data})

    def close(self, decision_digest: str | None = None, *, complete: bool = True) -> None:
        """`complete=False` (the run or export failed) leaves the trailer out, so readers
        refuse the file as cut short instead of taking it for a whole run."""
        if complete:
            self._write({"end": self.count, "decision_digest": decision_digest,
                         "sha256": self._chain.sha.hexdigest()}, hashed=False)
        if self._out is not self._raw:
            self._out.close()
        self._raw.close()


def _objects(stream: BinaryIO, path: Path) -> Iterator[Any]:
    """Each msgpack object in turn; a torn last object or a bad byte raises with its place."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=64 << 20)
    index = 0
    fed = 0
    while True:
        try:
            chunk = stream.read(_CHUNK)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise EventLogError(path, index, f"compressed data is corrupt or cut short "
                                             f"({type(exc).__name__}: {exc})") from None
        if not chunk:
            break
        try:
            unpacker.feed(chunk)
        except msgpack.BufferFull:
            raise EventLogError(path, index, "a record larger than 64 MiB (a damaged "
                                             "length?)") from None
        fed += len(chunk)
        try:
            for obj in unpacker:
                yield obj
                index += 1
        # TypeError: a map or array where a map key should be (unhashable).
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise EventLogError(path, index, f"not valid msgpack "
                                             f"({exc or type(exc).__name__})") from None
    if unpacker.tell() != fed:
        raise EventLogError(path, index, f"cut short in the middle of a record "
                                         f"({fed - unpacker.tell()} bytes left over)")


# A message record's fields and their types.
_FIELDS: dict[str, tuple[type, ...]] = {
    "seq": (int,), "subject": (str,), "time": (float, int), "msg_id": (str, _NONE),
    "data": (bytes,),
}
_TRAILER: dict[str, tuple[type, ...]] = {"end": (int,), "decision_digest": (str, _NONE),
                                         "sha256": (str,)}


class _Reader:
    """Takes a log's objects in file order and checks each: its checksum (version 2), its
    fields' names and types, and its place (sequence and, in a sim log, time never go
    back)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log: EventLog | None = None
        self.chain: _Chain | None = None  # None: a version-1 log, which has no checksums
        self.ended = False
        self.last_seq: dict[str, int] = {}  # seq_stream → the last sequence read of it

    def fail(self, index: int | None, why: str) -> EventLogError:
        return EventLogError(self.path, index, why)

    def take(self, index: int, obj: Any) -> None:
        if self.ended:
            raise self.fail(index, "data after the trailer record")
        if self.log is None:
            self.log = self._header(obj)
            return
        if not isinstance(obj, dict):
            raise self.fail(index, f"expected a map, found {type(obj).__name__}")
        trailer = "end" in obj
        content = self._unseal(obj, index, hashed=not trailer)
        if trailer:
            self._trailer(content, index, self.log)
        else:
            self.log.records.append(self._message(content, index, self.log))

    def finish(self) -> EventLog:
        if self.log is None:
            raise self.fail(None, "empty file")
        if not self.ended:
            last = len(self.log.records)
            raise self.fail(last + 1, f"truncated: no trailer after record {last} "
                                      "(the log was cut short)")
        return self.log

    # -- checks ----------------------------------------------------------------------------
    def _unseal(self, obj: dict[Any, Any], index: int, *, hashed: bool) -> dict[Any, Any]:
        """The record without its `crc`, once the chain confirms it (version 2). `hashed`:
        whether the record counts in the trailer's `sha256` (all but the trailer)."""
        if self.chain is None:
            return obj
        content = dict(obj)
        crc = content.pop(CHECK, None)
        if not (_typed(crc, (int,)) and 0 <= crc < _CRC_MAX):
            raise self.fail(index, f"no checksum (field {CHECK!r} missing or not a 32-bit "
                                   "unsigned integer): the record is damaged")
        try:
            expected = self.chain.seal(content, hashed=hashed)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. nested past the packer's limit
            raise self.fail(index, f"cannot be re-encoded to check it ({exc})") from None
        if crc != expected:
            raise self.fail(index, f"checksum mismatch ({CHECK} {crc:#010x} recorded, "
                                   f"{expected:#010x} computed): the record is damaged, or "
                                   "records before it were removed, added or reordered")
        return content

    def _header(self, obj: Any) -> EventLog:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise self.fail(0, f"not a {FORMAT} file (no header record)")
        version = obj.get("version")
        if not (_typed(version, (int,)) and version in READABLE):
            raise self.fail(0, f"unsupported version {version!r}; this Loom reads versions "
                               f"{', '.join(map(str, READABLE))}")
        if version >= 2:
            self.chain = _Chain()
            obj = self._unseal(obj, 0, hashed=True)
        elif CHECK in obj:
            raise self.fail(0, f"header: version 1 has no checksums, yet it carries {CHECK!r} "
                               "(a damaged version number?)")
        source = obj.get("source")
        if source not in ("sim", "live"):
            raise self.fail(0, f"header: source must be 'sim' or 'live', not {source!r}")
        return EventLog(self.path, source, RunInfo.from_dict(obj.get("run"), self.path),
                        versions=_versions(obj.get("versions"), self.path), version=version)

    def _fields(self, obj: dict[Any, Any], index: int, fields: Mapping[str, tuple[type, ...]],
                optional: tuple[str, ...] = ()) -> None:
        for name, types in fields.items():
            if name not in obj:
                if name in optional:
                    continue
                raise self.fail(index, f"missing field {name!r}")
            if not _typed(obj[name], types):
                raise self.fail(index, f"field {name!r} has type {type(obj[name]).__name__}")
        extra = sorted(map(repr, set(obj) - set(fields)))
        if extra:
            raise self.fail(index, f"unknown fields [{', '.join(extra)}]")

    def _message(self, obj: dict[Any, Any], index: int, log: EventLog) -> Record:
        self._fields(obj, index, _FIELDS)
        rec = Record(index, obj["seq"], obj["subject"], float(obj["time"]), obj["msg_id"],
                     obj["data"])
        if not math.isfinite(rec.time):
            raise self.fail(index, f"time {rec.time!r} is not a finite number")
        stream = seq_stream(log.source, rec.subject)
        last_seq = self.last_seq.get(stream)
        if last_seq is not None and rec.seq <= last_seq:
            raise self.fail(index, f"sequence {rec.seq} after {last_seq}: out of order")
        self.last_seq[stream] = rec.seq
        if log.records:
            last = log.records[-1]
            # A simulation's clock never goes back; a live log's times are its producers'.
            if log.source == "sim" and rec.time < last.time:
                raise self.fail(index, f"time {rec.time!r} after {last.time!r}: a simulated "
                                       "clock does not go back")
        return rec

    def _trailer(self, obj: dict[Any, Any], index: int, log: EventLog) -> None:
        if self.chain is None:  # version 1: no sha256, and the digest may be left out
            self._fields(obj, index, {k: _TRAILER[k] for k in ("end", "decision_digest")},
                         optional=("decision_digest",))
        else:
            self._fields(obj, index, _TRAILER)
        if obj["end"] != len(log.records):
            raise self.fail(index, f"trailer counts {obj['end']} messages, the file holds "
                                   f"{len(log.records)}")
        if self.chain is not None and obj["sha256"] != self.chain.sha.hexdigest():
            raise self.fail(index, f"the header and messages hash to "
                                   f"{self.chain.sha.hexdigest()}, the trailer says "
                                   f"{obj['sha256']}")
        log.decision_digest = obj.get("decision_digest")
        self.ended = True


def seq_stream(source: Source, subject: str) -> str:
    """Which sequence a record's `seq` counts in. A simulation keeps every message in one
    stream; a live cluster keeps dead letters in a second one (its own sequence), merged
    into an exported log by time, so there each stream's sequence rises on its own."""
    if source == "live" and subject.startswith(DEADLETTER_SUBJECT_PREFIX):
        return "deadletter"
    return "events"


def _versions(obj: Any, path: Path) -> Versions | None:
    """The header's `versions`; a header without them (older logs) means unknown."""
    if obj is None:
        return None
    if not (isinstance(obj, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items())):
        raise EventLogError(path, 0, "header: 'versions' must map names to version strings")
    return dict(obj)


def read_log(path: Path | str) -> EventLog:
    """Read and check a whole log; raises EventLogError naming the first bad record."""
    path = Path(path)
    if path.is_dir():
        raise EventLogError(path, None, "is a directory, not an event log file (`loom sim "
                                        "--log FILE` writes one; `loom compare --log DIR` "
                                        "writes DIR/<policy>.eventlog.gz)")
    if not path.is_file():
        raise EventLogError(path, None, "no such file")
    reader = _Reader(path)
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise EventLogError(path, None, f"cannot read it ({exc.strerror or exc})") from None
    with raw:
        gzipped = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw  # type: ignore[assignment]
        for index, obj in enumerate(_objects(stream, path)):
            reader.take(index, obj)
    return reader.finish()


def write_log(log: EventLog, path: Path) -> None:
    """Write `log` (e.g. one read, then filtered or edited) as a complete file in the current
    version, with the versions it was recorded with (none if unknown), not this process's."""
    writer = EventLogWriter(path, log.source, log.run, versions=log.versions)
    for rec in log.records:
        writer.record(rec.seq, rec.subject, rec.time, rec.msg_id, rec.data)
    writer.close(log.decision_digest)
