"""The one exception type the trace package raises for bad input."""

from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A trace or cluster file (or a bundled name) that cannot be read.

    `line` is the 1-based physical line in the file (the header is line 1) or None when the
    problem concerns the whole file (unknown name, unreadable or non-UTF-8 file). `field` is the
    CSV column at fault, or None when no single column is (unknown header, over-long row).
    """

    def __init__(self, path: Path | str, line: int | None, field: str | None, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        # Row errors name just the file, as editors and grep do; whole-file errors (unknown
        # name, unreadable file) show the full path, which is then the useful part.
        where = str(self.path) if self.line is None else f"{self.path.name} line {self.line}"
        if self.field is not None:
            where += f", field {self.field!r}"
        return f"{where}: {self.message}"

    def __reduce__(self) -> tuple[type[TraceError], tuple[Path, int | None, str | None, str]]:
        # ValueError pickles as cls(*args); keep the structured fields across processes.
        return (type(self), (self.path, self.line, self.field, self.message))
