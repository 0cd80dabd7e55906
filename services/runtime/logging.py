"""structlog set-up: one JSON object per line for services, readable lines for the CLI."""

from __future__ import annotations

import contextlib
import logging
import sys

import structlog


class _Stderr:
    """Whatever `sys.stderr` is at write time (tests and daemons swap it), never failing."""

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except (ValueError, OSError):  # closed or broken stream: logging must not stop a service
            return 0

    def flush(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()


def configure(level: str = "warning", json: bool = False) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(sort_keys=True)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper(), logging.WARNING)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
