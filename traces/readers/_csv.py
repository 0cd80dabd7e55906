"""CSV plumbing shared by every reader: loading, typed field access, JobSpec building.

Readers only say which column means what; everything that turns a bad cell into a TraceError
with file, line and column lives here so the messages stay uniform.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar

from pydantic import BaseModel, ValidationError

from schemas.job import JobSpec
from traces.errors import TraceError

MS_PER_S = 1000.0
M = TypeVar("M", bound=BaseModel)

# (file line, job) pairs; the line is kept for duplicate-id messages.
Parsed = list[tuple[int, JobSpec]]

# What every trace that records only durations assumes (run summaries' `trace_assumptions`).
DURATION_ONLY = (
    "duration-only trace: each job runs for its recorded duration at its recorded GPU count "
    "(one-second synthetic iterations), whatever policy runs it"
)


@dataclass(frozen=True)
class Table:
    """A CSV file read into memory: header plus (line, values) records, blank lines dropped."""

    path: Path
    columns: tuple[str, ...]
    records: list[tuple[int, list[str]]]
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {c: i for i, c in enumerate(self.columns)})

    def rows(self) -> Iterator[Row]:
        """Yield each record as a Row, rejecting those with the wrong number of fields."""
        width = len(self.columns)
        for line, values in self.records:
            if len(values) != width:
                # Name the first absent column when the row is short; a long row has no culprit.
                column = self.columns[len(values)] if len(values) < width else None
                raise TraceError(
                    self.path, line, column, f"expected {width} fields, got {len(values)}"
                )
            yield Row(self.path, line, values, self.index)


def read_table(path: Path) -> Table:
    """Read a whole CSV file (UTF-8, optional BOM, LF or CRLF line ends)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            header, records = _records(path, f)
    except UnicodeDecodeError as exc:
        raise TraceError(path, None, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TraceError(path, None, None, exc.strerror or str(exc)) from None
    return Table(path, header_columns(path, header), records)


def header_columns(path: Path, header: list[str] | None) -> tuple[str, ...]:
    """The column names of a header row, refusing an empty, blank or repeated name."""
    if header is None or not any(h.strip() for h in header):
        raise TraceError(path, 1, None, "expected a header row, found an empty line")
    columns = tuple(h.strip() for h in header)
    seen: set[str] = set()
    for column in columns:
        if not column:
            raise TraceError(path, 1, None, "empty column name in the header")
        if column in seen:
            raise TraceError(path, 1, column, "column appears twice in the header")
        seen.add(column)
    return columns


def _records(path: Path, f: TextIO) -> tuple[list[str] | None, list[tuple[int, list[str]]]]:
    reader = csv.reader(f)
    records: list[tuple[int, list[str]]] = []
    try:
        header = next(reader, None)
        for values in reader:
            # Skip blank lines (philly.csv ends with one); a lone-blank-cell row is one too.
            if values and (len(values) > 1 or values[0].strip()):
                records.append((reader.line_num, values))
    except csv.Error as exc:
        raise TraceError(path, reader.line_num, None, f"malformed CSV: {exc}") from None
    return header, records


class Where(Protocol):
    """Where a record sits (a CSV row, a JSON object), for errors naming file, line and field."""

    path: Path
    line: int

    def error(self, column: str | None, message: str) -> TraceError: ...


class Row:
    """One data record with typed accessors that raise TraceError naming line and column."""

    __slots__ = ("_index", "_values", "line", "path")

    def __init__(self, path: Path, line: int, values: list[str], index: dict[str, int]) -> None:
        self.path = path
        self.line = line
        self._values = values
        self._index = index

    def error(self, column: str | None, message: str) -> TraceError:
        return TraceError(self.path, self.line, column, message)

    def _raw(self, column: str, kind: str) -> str:
        value = self._values[self._index[column]].strip()
        if not value:
            raise self.error(column, f"missing value, expected {kind}")
        return value

    def _bad(self, column: str, kind: str) -> TraceError:
        value = self._values[self._index[column]].strip()
        if not value:
            return self.error(column, f"missing value, expected {kind}")
        return self.error(column, f"expected {kind}, got {value!r}")

    def text(self, column: str) -> str:
        return self._raw(column, "text")

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._index)

    def cell(self, column: str) -> str:
        """The cell as written, surrounding blanks removed ("" when empty)."""
        return self._values[self._index[column]].strip()

    # The numeric accessors run once per cell (~75,000 times for Muri's trace2), so each tries
    # the plain conversion first and only works out the message once the value is known bad.

    def positive_int(self, column: str) -> int:
        number = _to_int(self._values[self._index[column]])
        if number is None or number < 1:
            raise self._bad(column, "a positive integer")
        return number

    def non_negative_int(self, column: str) -> int:
        number = _to_int(self._values[self._index[column]])
        if number is None or number < 0:
            raise self._bad(column, "a non-negative integer")
        return number

    def positive_float(self, column: str) -> float:
        try:
            number = float(self._values[self._index[column]])
        except ValueError:
            number = math.nan
        if not 0 < number < math.inf:  # also false for NaN
            raise self._bad(column, "a positive number")
        return number

    def non_negative_float(self, column: str) -> float:
        try:
            number = float(self._values[self._index[column]])
        except ValueError:
            number = math.nan
        if not 0 <= number < math.inf:
            raise self._bad(column, "a non-negative number")
        return number

    def flag(self, column: str) -> bool:
        value = self._raw(column, "0 or 1")
        if value.lower() in ("0", "false"):
            return False
        if value.lower() in ("1", "true"):
            return True
        raise self.error(column, f"expected 0 or 1, got {value!r}")

    def timestamp(self, column: str) -> datetime:
        """A naive local timestamp such as '2017-10-09 07:01:55' (ISO 8601)."""
        kind = "a timestamp like '2017-10-09 07:01:55'"
        value = self._raw(column, kind)
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            raise self.error(column, f"expected {kind}, got {value!r}") from None
        if stamp.tzinfo is not None:
            # Mixing aware and naive stamps would make the offsets meaningless.
            raise self.error(column, f"expected {kind} without a time zone, got {value!r}")
        return stamp


def validated(row: Where, columns: Mapping[str, str], build: Callable[[], M]) -> M:
    """Run a pydantic constructor, reporting a failure against the CSV column it came from.

    `columns` maps model field names to the column that fed them; fields with no column (and
    model-level checks) are reported with field None.
    """
    try:
        return build()
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = err["loc"]
        message = err["msg"].removeprefix("Value error, ")
        column = None
        if loc:
            column = columns.get(str(loc[0]))
            message += f", got {err['input']!r}"
        raise row.error(column, message) from None


def make_job(row: Where, columns: Mapping[str, str], **fields: Any) -> JobSpec:
    """Build a JobSpec; `columns` maps JobSpec fields to the CSV columns they came from."""
    return validated(row, columns, lambda: JobSpec.model_validate(fields))


def _to_int(value: str) -> int | None:
    """int(value), also accepting integral floats such as "8.0" (pandas writes those)."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


def unit_iterations(duration_s: float) -> tuple[int, float]:
    """Synthesise (iterations, seconds per iteration) for traces that record only a duration.

    About one-second iterations keep progress granular enough for preemption while the product
    stays exactly the recorded duration.
    """
    iterations = max(1, round(duration_s))
    return iterations, duration_s / iterations


@dataclass(frozen=True)
class TraceFormat:
    """A CSV trace dialect, recognised by its header (column order does not matter).
    `assumptions` say how its recorded jobs become simulated ones, where that is a modelling
    choice (duration-only traces), for run summaries."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    default_overhead: str
    read: Callable[[Table], Parsed]
    assumptions: tuple[str, ...] = ()

    def matches(self, columns: tuple[str, ...]) -> bool:
        seen = set(columns)
        return set(self.required) <= seen <= set(self.required) | set(self.optional)

    def describe(self) -> str:
        extra = f" [+ {', '.join(self.optional)}]" if self.optional else ""
        return f"{self.name} ({', '.join(self.required)}{extra})"
