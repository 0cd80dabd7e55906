"""Where a trainer writes its protocol records: stdout, an inherited descriptor, or a file.

Shared by Loom's bundled trainer (`shell.py`) and the trainer SDK (`loom.sdk`); imports only
the standard library and the protocol.
"""

from __future__ import annotations

import os
import sys

from schemas.trainer import Record, encode

__all__ = ["Reporter"]


class Reporter:
    """Writes protocol lines to stdout, an inherited file descriptor or a file.

    With `stdout` and `protect_stdout`, the real stdout is moved to a private descriptor and
    descriptor 1 is pointed at stderr, so nothing else (a stray print, a C library) can write
    into the protocol stream."""

    def __init__(self, spec: str, *, protect_stdout: bool = False) -> None:
        self._owned = False
        if spec == "stdout":
            if protect_stdout:
                sys.stdout.flush()
                self._fd = os.dup(1)
                os.dup2(2, 1)
                self._owned = True
            else:
                self._fd = 1
        elif spec.startswith("fd:"):
            self._fd = int(spec[3:])
        else:
            self._fd = os.open(spec[5:], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._owned = True

    def emit(self, record: Record) -> None:
        data = encode(record).encode()
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        if self._owned:
            os.close(self._fd)
            self._owned = False
