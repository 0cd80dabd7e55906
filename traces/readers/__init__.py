"""One reader per trace dialect; `detect` picks the reader from a file's header."""

from __future__ import annotations

from traces.errors import TraceError
from traces.readers import elasticflow, itp, muri, philly, pollux, tiresias
from traces.readers._csv import Parsed, Table, TraceFormat, read_table

FORMATS: tuple[TraceFormat, ...] = (
    muri.FORMAT,
    tiresias.FORMAT,
    elasticflow.FORMAT,
    itp.FORMAT,
    itp.RAW_FORMAT,
    philly.FORMAT,
    pollux.FORMAT,
)


def detect(table: Table) -> TraceFormat:
    """The format whose required columns are all present and which allows every other one.

    No two formats accept the same header, so at most one matches.
    """
    for fmt in FORMATS:
        if fmt.matches(table.columns):
            return fmt
    known = "; ".join(f.describe() for f in FORMATS)
    raise TraceError(
        table.path,
        1,
        None,
        f"unrecognised header ({', '.join(table.columns)}); known formats: {known}",
    )


__all__ = ["FORMATS", "Parsed", "Table", "TraceFormat", "detect", "read_table"]
