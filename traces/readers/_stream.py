"""Plumbing shared by the production-trace readers, which stream their files.

The production traces (Philly, Helios, Acme, Alibaba PAI) run to millions of rows, so their
readers never hold a file's rows: `csv_rows` hands out one `Row` at a time from the open file
(the csv module over it) and `json_objects` one object at a time from a JSON list. A reader's
`scan(path)` turns each record into a `Candidate`, a job that ran, or a skip reason (a short
phrase such as "never started"), for a job that never ran and so has nothing to simulate; the
loader counts those by reason. A candidate carries the recorded submission time on the file's
own clock (`Clock`: epoch seconds or date-times) and the JobSpec fields that do not depend on
where the trace starts, so the loader can validate a job once, keep only what filters and
orders the trace, and build the JobSpecs again, one at a time, when they are iterated.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from traces.errors import TraceError
from traces.readers._csv import Row, Where, header_columns

# The reasons a reader gives for a record that is not a job of the simulated trace.
NEVER_STARTED = "never started"
NO_GPUS = "no GPUs"
ZERO_DURATION = "zero duration"
NO_END = "still running (no end time)"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A recorded job that ran: what the loader needs to filter, order and build it.

    `fields` are JobSpec fields without `submit_time_s`; `columns` maps them to the columns
    (or JSON keys) they came from, for errors; `submit` is in seconds on the file's own clock.
    `fail_at` are the failures the trace records, as progress marks (`failure_marks`); they
    become the JobSpec's `fail_at` only when the run replays failures.
    """

    where: Where
    submit: float
    state: str | None
    fields: dict[str, Any]
    columns: Mapping[str, str]
    restarts: int = 0
    fail_at: tuple[float, ...] = ()


Scan = Iterator[Candidate | str]


@dataclass(frozen=True)
class StreamFormat:
    """A production trace layout, read by streaming.

    CSV layouts are recognised by their header like `TraceFormat` (`required`, `optional`);
    the others (a JSON job log, headerless tables) by `traces.readers.locate`. `assumptions`
    say how the recorded jobs become simulated ones, for run summaries, and `failures` what
    becomes of the failures it records: (without replaying them, replaying them).
    """

    name: str
    default_overhead: str
    scan: Callable[[Path], Scan]
    assumptions: tuple[str, ...]
    failures: tuple[str, str]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    has_states: bool = True

    def assumptions_for(self, replay_failures: bool) -> tuple[str, ...]:
        """What a run of this trace assumes, failures replayed or not."""
        return (*self.assumptions, self.failures[replay_failures])

    def matches(self, columns: tuple[str, ...]) -> bool:
        if not self.required:
            return False
        seen = set(columns)
        return set(self.required) <= seen <= set(self.required) | set(self.optional)

    def describe(self) -> str:
        if not self.required:
            return self.name
        extra = f" [+ {', '.join(self.optional)}]" if self.optional else ""
        return f"{self.name} ({', '.join(self.required)}{extra})"


def csv_rows(path: Path, columns: tuple[str, ...] | None = None) -> Iterator[Row]:
    """The data rows of a CSV file, read one at a time (UTF-8, optional BOM, LF or CRLF).

    With `columns` the file has no header (Alibaba's tables), though a first row that spells
    exactly those names is taken for one and skipped; without, the first row is the header.
    Blank lines are skipped; a row of the wrong width is a TraceError.
    """
    reader: Any = None
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            headerless = columns is not None
            if columns is None:
                columns = header_columns(path, next(reader, None))
            index = {c: i for i, c in enumerate(columns)}
            width = len(columns)
            names = list(columns)
            for values in reader:
                if not values or (len(values) == 1 and not values[0].strip()):
                    continue
                if headerless:
                    headerless = False  # only the first row may be a header
                    if [v.strip() for v in values] == names:
                        continue
                if len(values) != width:
                    column = columns[len(values)] if len(values) < width else None
                    raise TraceError(path, reader.line_num, column,
                                     f"expected {width} fields, got {len(values)}")
                yield Row(path, reader.line_num, values, index)
    except csv.Error as exc:
        raise TraceError(path, reader.line_num if reader else None, None,
                         f"malformed CSV: {exc}") from None
    except UnicodeDecodeError as exc:
        line = reader.line_num + 1 if reader else None
        raise TraceError(path, line, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TraceError(path, None, None, exc.strerror or str(exc)) from None


def first_row(path: Path) -> list[str] | None:
    """The first non-blank CSV row of a file (None: empty, unreadable or not UTF-8 text)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            for values in csv.reader(f):
                if values and (len(values) > 1 or values[0].strip()):
                    return [v.strip() for v in values]
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


class JsonRecord:
    """One item of a JSON list, for errors: file, the line the item starts on, the key, and
    the item's place in the list (a log written on one line has only line 1)."""

    __slots__ = ("index", "line", "path")

    def __init__(self, path: Path, line: int, index: int) -> None:
        self.path = path
        self.line = line
        self.index = index

    def error(self, column: str | None, message: str) -> TraceError:
        return TraceError(self.path, self.line, column, f"{message} (item {self.index + 1:,} "
                                                        "of the list)")


_CHUNK = 1 << 20


class _Text:
    """A text file read a chunk at a time, with the line of any position in the buffer."""

    __slots__ = ("base", "buf", "counted", "eof", "f", "line", "pos")

    def __init__(self, f: Any) -> None:
        self.f = f
        self.buf = ""
        self.pos = 0  # next character to look at
        self.base = 0  # absolute offset of buf[0]
        self.counted = 0  # buf[:counted] holds line - 1 newlines in all (with what came before)
        self.line = 1
        self.eof = False

    def more(self) -> None:
        """Drop what is consumed and append the next chunk (sets `eof` at the end)."""
        self.line_at(self.pos)
        chunk = self.f.read(_CHUNK)
        self.eof = not chunk
        self.buf = self.buf[self.pos:] + chunk
        self.base += self.pos
        self.counted -= self.pos
        self.pos = 0

    def peek(self) -> str:
        """The next non-blank character ("" at the end of the file), not consumed."""
        while True:
            size, buf, pos = len(self.buf), self.buf, self.pos
            while pos < size and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < size:
                return buf[pos]
            if self.eof:
                return ""
            self.more()

    def line_at(self, pos: int) -> int:
        """The line of buf[pos]; positions asked for never decrease."""
        self.line += self.buf.count("\n", self.counted, pos)
        self.counted = pos
        return self.line


def json_objects(path: Path) -> Iterator[tuple[JsonRecord, Any]]:
    """The items of a file holding one JSON list, decoded one at a time.

    Reads 1 MiB at a time, so a job log of any size takes the memory of its largest item.
    Each item comes with the line it starts on.
    """
    decoder = json.JSONDecoder()
    try:
        with path.open(encoding="utf-8-sig") as f:
            text = _Text(f)
            if text.peek() != "[":
                raise TraceError(path, text.line_at(text.pos), None,
                                 "expected a JSON list of jobs ('[' ...)")
            text.pos += 1
            separated = True  # a job may start here (after '[' or ',')
            items = 0
            failed_at = -1  # absolute offset of the last decoding error
            while True:
                char = text.peek()
                if char == "]":
                    if separated and items:
                        raise TraceError(path, text.line_at(text.pos), None,
                                         "expected a job after ',', got ']'")
                    text.pos += 1
                    if text.peek():
                        raise TraceError(path, text.line_at(text.pos), None,
                                         "unexpected text after the JSON list")
                    return
                if not char:
                    raise TraceError(path, text.line_at(text.pos), None,
                                     "the JSON list is not closed (no ']')")
                if not separated:
                    if char != ",":
                        raise TraceError(path, text.line_at(text.pos), None,
                                         f"expected ',' or ']' between jobs, got {char!r}")
                    text.pos += 1
                    separated = True
                    continue
                try:
                    item, end = decoder.raw_decode(text.buf, text.pos)
                except json.JSONDecodeError as exc:
                    # Either the item runs past the chunk (read on and retry) or it is bad:
                    # the same error at the same place with a chunk more to read says so.
                    here = text.base + exc.pos
                    if text.eof or (here == failed_at and len(text.buf) - exc.pos > _CHUNK):
                        where = text.line_at(max(exc.pos, text.pos))
                        raise TraceError(path, where, None, f"invalid JSON: {exc.msg}") from None
                    failed_at = here
                    text.more()
                    continue
                separated = False
                yield JsonRecord(path, text.line_at(text.pos), items), item
                items += 1
                text.pos = end
    except UnicodeDecodeError as exc:
        raise TraceError(path, None, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TraceError(path, None, None, exc.strerror or str(exc)) from None


_EPOCH = datetime(1970, 1, 1)
TIME_KINDS = "epoch seconds or a date-time like '2020-04-01 08:00:00'"


class Clock:
    """Times of one file, as seconds: epoch seconds or ISO 8601 date-times.

    A file uses one kind throughout: epoch seconds, naive date-times (read as UTC; only
    differences matter) or date-times with a zone; mixing them would make the offsets
    meaningless, so it is an error.
    """

    __slots__ = ("kind",)

    def __init__(self) -> None:
        self.kind: str | None = None

    def seconds(self, where: Where, column: str, value: str) -> float:
        """`value` (non-empty) in seconds, or a TraceError naming `column`."""
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None:
            if not math.isfinite(number) or number < 0:
                raise where.error(column, f"expected {TIME_KINDS}, got {value!r}")
            kind, seconds = "epoch seconds", number
        else:
            try:
                stamp = datetime.fromisoformat(value)
            except ValueError:
                raise where.error(column, f"expected {TIME_KINDS}, got {value!r}") from None
            if stamp.tzinfo is None:
                kind, seconds = "date-times", (stamp - _EPOCH).total_seconds()
            else:
                kind, seconds = "date-times with a time zone", stamp.astimezone(UTC).timestamp()
        if kind != self.kind:
            if self.kind is not None:
                raise where.error(column, f"{value!r} is not like the file's earlier times, "
                                          f"which are {self.kind}; a file uses one kind")
            self.kind = kind
        return seconds

    def cell(self, row: Row, column: str) -> float | None:
        """A time cell of a CSV row; None when empty."""
        value = row.cell(column)
        return self.seconds(row, column, value) if value else None


def optional_count(row: Row, column: str) -> int | None:
    """A non-negative integer cell (integral floats such as "8.0" too); None when empty."""
    return row.non_negative_int(column) if row.cell(column) else None


def optional_amount(row: Row, column: str) -> float | None:
    """A non-negative number cell; None when empty."""
    return row.non_negative_float(column) if row.cell(column) else None


def recorded_run(row: Row, gpus: int, start: float | None, end: float | None,
                 duration: float | None) -> float | str:
    """How long a recorded GPU job ran (its `duration`, else end - start), or why it has
    nothing to simulate (a skip reason above). Shared by the CSV logs (Helios, Acme)."""
    if gpus == 0:
        return NO_GPUS
    if start is None:
        return NEVER_STARTED
    if duration is None:
        if end is None:
            return NO_END
        duration = end - start
        if duration < 0:
            raise row.error("end_time", "is before start_time (and duration is empty)")
    return duration if duration > 0 else ZERO_DURATION


def failure_marks(restarted_at: Sequence[float], failed: bool, duration_s: float,
                  iterations: int) -> tuple[float, ...]:
    """A recorded job's failures as progress marks (`JobSpec.fail_at`) of a duration-only
    job (`unit_iterations`): the run time (s) at which each attempt the trace restarted
    failed, and the whole run if the job `failed` in the end. An attempt that added no run
    time repeats the mark before it (or the end) and is dropped: a run cannot fail twice at
    the same point, nor fail at the end and be restarted."""
    per = duration_s / iterations  # seconds per iteration, as unit_iterations gives them
    marks: list[float] = []
    for at in restarted_at:
        mark = at / per
        if 0.0 < mark < iterations and (not marks or mark > marks[-1]):
            marks.append(mark)
    if failed:
        marks.append(float(iterations))
    return tuple(marks)
