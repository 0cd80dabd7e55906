"""A run's event log as a file: msgpack-framed records, optionally gzipped.

Format `loom-eventlog` version 1 (see docs/replay.md): a concatenation of msgpack maps.

- record 0, the header: `{"format": "loom-eventlog", "version": 1, "source": "sim" | "live",
  "run": {...}, "versions": {...}}`; `run` holds what replay needs to rebuild the cores
  (policy, cluster spec, seed, overhead model, re-planning, placement, throughput profile,
  trace name); `versions` the versions of Python, Loom and the libraries whose results reach
  decisions (solvers, numpy, numba), absent in logs written before it existed (unknown);
- then one record per message the bus carried, in delivery order:
  `{"seq": stream sequence, "subject": ..., "time": the clock's time at publish,
  "msg_id": Nats-Msg-Id or nil, "data": the payload bytes as on the wire}`;
- last, the trailer: `{"end": number of messages, "decision_digest": hex or nil}`. A file
  without it was cut short.

A file whose first two bytes are gzip's magic is read through gzip, whatever its name.
"""

from __future__ import annotations

import functools
import gzip
import importlib.metadata
import platform
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgpack

FORMAT = "loom-eventlog"
VERSION = 1
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16

Source = Literal["sim", "live"]

# What makes decisions besides Loom's own code: the solvers behind cvxpy (Clarabel, HiGHS,
# SCS), scipy (AlloX's assignment, Pollux's model fit), numpy, numba (ElasticFlow's kernel)
# and rustworkx (Muri's matching). Another version may return another of several equal
# optima (docs/replay.md, "Solvers and determinism"), so logs and summaries say which made
# them.
DECISION_LIBRARIES = ("numpy", "scipy", "cvxpy", "highspy", "clarabel", "scs", "numba",
                      "rustworkx")
LOOM_DISTRIBUTION = "loom-scheduler"
NOT_INSTALLED = "not installed"
Versions = dict[str, str]


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


@functools.cache
def _running() -> tuple[tuple[str, str], ...]:
    names = [("python", platform.python_version()), ("loom", _installed(LOOM_DISTRIBUTION))]
    names += [(lib, _installed(lib)) for lib in DECISION_LIBRARIES]
    return tuple(names)


def running_versions() -> Versions:
    """Versions of Python, Loom and the decision-making libraries in this process."""
    return dict(_running())


def version_changes(recorded: Mapping[str, str] | None,
                    running: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(name, recorded, running) for each version that differs; a name the recording lacks
    is unknown, not a difference."""
    if not recorded:
        return []
    return [(name, recorded[name], now) for name, now in running.items()
            if name in recorded and recorded[name] != now]


def _listed(versions: Mapping[str, str]) -> str:
    return ", ".join(f"{name} {v}" for name, v in versions.items())


def versions_note(recorded: Mapping[str, str] | None, running: Mapping[str, str]) -> list[str]:
    """What a divergent replay says about versions: which differ from the recording (a
    solver upgrade named as the likely cause), that none do, or that the log does not say."""
    if not recorded:
        return ["versions: the log does not say which made its decisions (a live log, or one "
                f"written before logs carried them); running {_listed(running)}"]
    changes = version_changes(recorded, running)
    if not changes:
        return ["versions: as recorded, so no library upgrade explains this divergence"]
    lines = [f"versions: recorded with {name} {old}, running {new}" for name, old, new in changes]
    if any(name in DECISION_LIBRARIES for name, _, _ in changes):
        lines.append("  another version of a solver or numeric library is the likely cause: "
                     "where several solutions are optimal it may return another "
                     "(docs/replay.md, \"Solvers and determinism\")")
    return lines


class EventLogError(ValueError):
    """A log that cannot be read; the message names the file, the record and why."""

    def __init__(self, path: Path | str, record: int | None, why: str) -> None:
        where = f"{path}" if record is None else f"{path}, record {record}"
        super().__init__(f"{where}: {why}")
        self.path = str(path)
        self.record = record
        self.why = why


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
    trace: str = "trace"
    run_id: str = "run"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Any, path: Path | str) -> RunInfo:
        if not isinstance(data, dict):
            raise EventLogError(path, 0, "header: 'run' must be a map")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise EventLogError(path, 0, f"header: unknown run fields {unknown}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise EventLogError(path, 0, f"header: {exc}") from None


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


def _open_read(path: Path) -> BinaryIO:
    raw = path.open("rb")
    if raw.read(2) == _GZIP_MAGIC:
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    raw.seek(0)
    return raw


class EventLogWriter:
    """Writes a log record by record; `close(digest)` writes the trailer. A `.gz` name gzips
    (with a zero timestamp, so the same run gives the same bytes).

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
        self.count = 0
        header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "source": source,
                                  "run": run.to_dict()}
        if versions == "running":
            versions = running_versions()
        if versions is not None:
            header["versions"] = dict(versions)
        self._write(header)

    def _write(self, obj: dict[str, Any]) -> None:
        self._out.write(self._packer.pack(obj))

    def record(self, seq: int, subject: str, time: float, msg_id: str | None,
               data: bytes) -> None:
        self.count += 1
        self._write({"seq": seq, "subject": subject, "time": time, "msg_id": msg_id,
                     "data": data})

    def close(self, decision_digest: str | None = None, *, complete: bool = True) -> None:
        """`complete=False` (the run or export failed) leaves the trailer out, so readers
        refuse the file as cut short instead of taking it for a whole run."""
        if complete:
            self._write({"end": self.count, "decision_digest": decision_digest})
        if self._out is not self._raw:
            self._out.close()
        self._raw.close()


def _versions(obj: Any, path: Path) -> Versions | None:
    """The header's `versions`; a header without them (older logs) means unknown."""
    if obj is None:
        return None
    if not (isinstance(obj, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items())):
        raise EventLogError(path, 0, "header: 'versions' must map names to version strings")
    return dict(obj)


def _header(obj: Any, path: Path) -> tuple[Source, RunInfo]:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise EventLogError(path, 0, f"not a {FORMAT} file (no header record)")
    if obj.get("version") != VERSION:
        raise EventLogError(path, 0, f"unsupported version {obj.get('version')!r}; "
                                     f"this Loom reads version {VERSION}")
    source = obj.get("source")
    if source not in ("sim", "live"):
        raise EventLogError(path, 0, f"header: source must be 'sim' or 'live', not {source!r}")
    return source, RunInfo.from_dict(obj.get("run"), path)


_FIELDS: dict[str, tuple[type, ...]] = {
    "seq": (int,), "subject": (str,), "time": (float, int), "msg_id": (str, type(None)),
    "data": (bytes,),
}


def _record(obj: Any, index: int, path: Path) -> Record:
    if not isinstance(obj, dict):
        raise EventLogError(path, index, f"expected a map, found {type(obj).__name__}")
    for name, types in _FIELDS.items():
        if name not in obj:
            raise EventLogError(path, index, f"missing field {name!r}")
        if not isinstance(obj[name], types) or isinstance(obj[name], bool):
            raise EventLogError(path, index, f"field {name!r} has type "
                                             f"{type(obj[name]).__name__}")
    extra = sorted(set(obj) - set(_FIELDS))
    if extra:
        raise EventLogError(path, index, f"unknown fields {extra}")
    return Record(index, obj["seq"], obj["subject"], float(obj["time"]), obj["msg_id"],
                  obj["data"])


def _objects(stream: BinaryIO, path: Path) -> Iterator[Any]:
    """Each msgpack object in turn; a torn last object or a bad byte raises with its place."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=64 << 20)
    index = 0
    fed = 0
    while True:
        try:
            chunk = stream.read(_CHUNK)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise EventLogError(path, index, f"compressed data is corrupt or cut short "
                                             f"({type(exc).__name__}: {exc})") from None
        if not chunk:
            break
        unpacker.feed(chunk)
        fed += len(chunk)
        try:
            for obj in unpacker:
                yield obj
                index += 1
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
            raise EventLogError(path, index, f"not valid msgpack ({exc})") from None
    if unpacker.tell() != fed:
        raise EventLogError(path, index, f"cut short in the middle of a record "
                                         f"({fed - unpacker.tell()} bytes left over)")


def read_log(path: Path | str) -> EventLog:
    """Read and check a whole log; raises EventLogError naming the first bad record."""
    path = Path(path)
    if not path.is_file():
        raise EventLogError(path, None, "no such file")
    log: EventLog | None = None
    ended = False
    with _open_read(path) as stream:
        for index, obj in enumerate(_objects(stream, path)):
            if ended:
                raise EventLogError(path, index, "data after the trailer record")
            if log is None:
                source, run = _header(obj, path)
                log = EventLog(path, source, run, versions=_versions(obj.get("versions"), path))
                continue
            if isinstance(obj, dict) and "end" in obj:
                if obj["end"] != len(log.records):
                    raise EventLogError(path, index, f"trailer counts {obj['end']} messages, "
                                                     f"the file holds {len(log.records)}")
                digest = obj.get("decision_digest")
                log.decision_digest = digest if isinstance(digest, str) else None
                ended = True
                continue
            rec = _record(obj, index, path)
            if log.records and rec.seq <= log.records[-1].seq:
                raise EventLogError(path, index, f"sequence {rec.seq} after "
                                                 f"{log.records[-1].seq}: out of order")
            log.records.append(rec)
    if log is None:
        raise EventLogError(path, None, "empty file")
    if not ended:
        last = len(log.records)
        raise EventLogError(path, last + 1, f"truncated: no trailer after record {last} "
                                            "(the log was cut short)")
    return log


def write_log(log: EventLog, path: Path) -> None:
    """Write `log` (e.g. one read, then filtered or edited) as a complete file, with the
    versions it was recorded with (none if unknown), not this process's."""
    writer = EventLogWriter(path, log.source, log.run, versions=log.versions)
    for rec in log.records:
        writer.record(rec.seq, rec.subject, rec.time, rec.msg_id, rec.data)
    writer.close(log.decision_digest)
