"""One reader per trace dialect; `detect` picks the reader from a file's header.

The research traces are small and read whole (`FORMATS`, a `TraceFormat` each); the
production traces are streamed (`STREAM_FORMATS`, see `_stream`), and `locate` recognises
them from their content: a JSON list (Philly's job log), a header (Helios, Acme) or the shape
of a headerless row (Alibaba PAI), or a folder holding such files.
"""

from __future__ import annotations

from pathlib import Path

from traces.errors import TraceError
from traces.readers import (
    acme,
    elasticflow,
    helios,
    itp,
    muri,
    pai,
    philly,
    philly_log,
    pollux,
    tiresias,
)
from traces.readers._csv import Parsed, Table, TraceFormat, read_table
from traces.readers._stream import StreamFormat, first_row

FORMATS: tuple[TraceFormat, ...] = (
    muri.FORMAT,
    tiresias.FORMAT,
    elasticflow.FORMAT,
    itp.FORMAT,
    itp.RAW_FORMAT,
    philly.FORMAT,
    pollux.FORMAT,
)
STREAM_FORMATS: tuple[StreamFormat, ...] = (
    philly_log.FORMAT,
    helios.FORMAT,
    acme.FORMAT,
    pai.FORMAT,
)
# What a folder given as --trace may hold, in the order looked for.
_FOLDER_FILES = (
    (philly_log.JOB_LOG, philly_log.FORMAT),
    (helios.LOG, helios.FORMAT),
)


def detect(table: Table) -> TraceFormat:
    """The format whose required columns are all present and which allows every other one.

    No two formats accept the same header, so at most one matches.
    """
    for fmt in FORMATS:
        if fmt.matches(table.columns):
            return fmt
    known = "; ".join([*(f.describe() for f in FORMATS),
                       *(f.describe() for f in STREAM_FORMATS)])
    raise TraceError(
        table.path,
        1,
        None,
        f"unrecognised header ({', '.join(table.columns)}); known formats: {known}",
    )


def locate(path: Path) -> tuple[StreamFormat, Path] | None:
    """The production trace at `path` (a file, or a folder holding one) and the path its
    reader takes; None for a file that is none of them (a research trace, or unknown)."""
    if path.is_dir():
        if pai.tables(path) is not None:
            return pai.FORMAT, path
        for name, fmt in _FOLDER_FILES:
            if (path / name).is_file():
                return fmt, path / name
        expected = ", ".join([*(n for n, _ in _FOLDER_FILES),
                              f"{pai.JOB_TABLE} with {pai.TASK_TABLE}"])
        raise TraceError(path, None, None, f"is a folder with no trace Loom reads (looked for "
                                           f"{expected})")
    if philly_log.is_job_log(path):
        return philly_log.FORMAT, path
    if pai.tables(path) is not None:
        return pai.FORMAT, path
    header = first_row(path)
    if header is not None:
        for fmt in STREAM_FORMATS:
            if fmt.matches(tuple(header)):
                return fmt, path
    return None


__all__ = [
    "FORMATS",
    "STREAM_FORMATS",
    "Parsed",
    "StreamFormat",
    "Table",
    "TraceFormat",
    "detect",
    "locate",
    "read_table",
]
