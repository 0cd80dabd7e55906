"""How much a live cluster's JetStream streams may hold, and the stream configs that say so.

Two streams (docs/architecture.md, "Bounded storage"):

- the event stream (`LOOM`, everything on `loom.>` but dead letters) is the run's history: a
  restarted scheduler rebuilds its job table from it (services/scheduler/recovery.py) and
  `loom log export` replays it. It is bounded by `max_bytes` with `discard=new`: once full,
  JetStream refuses new messages (publishers get an error) rather than dropping history.
  Its age limit is off by default: a job whose last transition aged out would be forgotten
  by a restarted scheduler, so an age limit must exceed any job's life.
- the dead-letter stream (`LOOM_DEADLETTER`, `loom.deadletter.>`) holds diagnostic copies
  (`DeadLetter.kept`: the refused payload cut to 4 KiB; the original stays in `LOOM`), so
  it drops its oldest (`discard=old`) when full.

A message bigger than `max_msg_size` is refused by the stream itself, whatever the client's
`max_payload`. This module does not load the NATS client (`loom`'s parser reads its defaults
and parsers); `services.runtime.nats_live` builds the stream configs from it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from schemas import subjects
from schemas.codec import MAX_EVENT_BYTES

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
DEFAULT_MAX_BYTES = 8 * GIB
DEFAULT_MAX_AGE_S = 0.0  # no age limit (see the module docstring)
DEFAULT_DEADLETTER_MAX_BYTES = 256 * MIB
# A dead letter is at most 4 KiB of payload, 1,024 characters of reason, a NATS subject
# (at most 4 KiB: the server's control line) and an envelope: 16 KiB holds it with room.
DEADLETTER_MAX_MSG_BYTES = 16 * KIB
DUPLICATE_WINDOW_S = 600.0  # JetStream drops a repeated Nats-Msg-Id within this window
MAX_AGE_S = 9e9  # about 285 years: JetStream's int64 nanoseconds end at 9.2e9 s


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What `ensure_stream` asks for; the flags `--stream-max-bytes`, `--stream-max-age`
    and `--deadletter-max-bytes` set it. `max_age_s` 0 means no age limit."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_age_s: float = DEFAULT_MAX_AGE_S
    deadletter_max_bytes: int = DEFAULT_DEADLETTER_MAX_BYTES

    def __post_init__(self) -> None:
        _at_least("--stream-max-bytes", self.max_bytes, MAX_EVENT_BYTES,
                  "the largest event (1 MiB)")
        _at_least("--deadletter-max-bytes", self.deadletter_max_bytes,
                  DEADLETTER_MAX_MSG_BYTES, "the largest dead letter (16 KiB)")
        age = self.max_age_s
        if isinstance(age, bool) or not isinstance(age, (int, float)) or not math.isfinite(age):
            raise ValueError(f"--stream-max-age must be a finite number of seconds, not {age!r}")
        # JetStream refuses a duplicate window longer than the age limit, and counts the age
        # in nanoseconds, in 64 bits.
        if age != 0 and not DUPLICATE_WINDOW_S <= age <= MAX_AGE_S:
            raise ValueError(f"--stream-max-age {age:g} s: 0 (no age limit) or from "
                             f"{DUPLICATE_WINDOW_S:g} s (the de-duplication window) to "
                             f"{MAX_AGE_S:g} s; it must also outlast any job, or a restarted "
                             "scheduler forgets it")


def _at_least(flag: str, value: int, least: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{flag} must be a whole number of bytes, not {value!r}")
    if value < least:
        raise ValueError(f"{flag} {value}: must be at least {least} bytes, {what}")


def deadletter_stream(stream: str) -> str:
    """The dead-letter stream beside event stream `stream` (`LOOM` → `LOOM_DEADLETTER`)."""
    return subjects.DEADLETTER_STREAM if stream == subjects.STREAM else f"{stream}_DEADLETTER"


# The settings `ensure_stream` compares on an existing stream (others are left to operators).
COMPARED = ("subjects", "max_bytes", "max_age", "max_msg_size", "discard")


def differences(existing: Any, wanted: Any) -> dict[str, str]:
    """Setting → "has X, asked for Y", for each compared setting of two stream configs
    (nats-py `StreamConfig`s) that differs."""
    out = {}
    for name in COMPARED:
        have, want = _norm(name, getattr(existing, name)), _norm(name, getattr(wanted, name))
        if have != want:
            out[name] = f"has {have}, asked for {want}"
    return out


def discard_name(value: object) -> str:
    """A stream's discard policy, "new" or "old": an enum from a client, a string (or
    nothing, meaning "old") from the server."""
    return str(getattr(value, "value", value) or "old")


def _norm(name: str, value: object) -> object:
    """One spelling per setting: the server says -1 or 0 where a client may send None."""
    if name == "subjects":
        return sorted(value or [])  # type: ignore[call-overload]
    if name == "discard":
        return discard_name(value)
    if name == "max_age":
        return float(value or 0.0)  # type: ignore[arg-type]
    return -1 if value is None else value  # max_bytes, max_msg_size: -1 is no limit


_BYTES = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNIT_BYTES = {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": TIB}
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_bytes(text: str) -> int:
    """`8589934592`, `8G`, `8GiB`, `256M`, `512k` → bytes (binary units: 1K = 1024)."""
    m = _BYTES.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a size: a whole number of bytes, or one with a "
                         "unit K, M, G or T (binary: 8G = 8 GiB)")
    return int(m.group(1)) * _UNIT_BYTES[m.group(2).lower()]


def parse_age(text: str) -> float:
    """`0` (no limit), `86400`, `90m`, `36h`, `30d`, `2w` → seconds."""
    m = _AGE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not an age: seconds, or a number with a unit s, m, h, "
                         "d or w (30d = 30 days); 0 for no age limit")
    return float(m.group(1)) * _UNIT_S[m.group(2).lower()]
