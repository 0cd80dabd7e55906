"""What the `loom` command modules share: the consoles and the argument types of their flags."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from domain.overhead import parse_overhead

# Wide enough for the results table when piped to a file or CI log.
out = Console(width=None if sys.stdout.isatty() else 160)
# One message, one line, even in a log; user text (paths, values such as 36:x:36) printed as
# given: no emoji codes, and markup escaped where messages are built.
err = Console(stderr=True, soft_wrap=True, emoji=False)


def overhead(text: str) -> str:
    """An `--overhead` value, checked when the flag is parsed."""
    try:
        parse_overhead(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more (and finite)")
    return value


def slug(text: str) -> str:
    """A trace or cluster name as part of an output folder's name."""
    return text.replace("/", "_").replace("\\", "_").removesuffix(".csv")
