"""`--trace-filter`: the usual cuts of a trace, applied while it is read.

An expression is clauses separated by blanks or ';', each at most once:

    window=START:END   submitted in [START, END) counted from the trace's first submission;
                       either end may be left out; numbers are seconds, or take a unit
                       s, m, h or d (`window=7d:14d`). The kept jobs' times then count from
                       START, so the simulation starts with the window.
    vc=A,B             jobs of these virtual clusters (tenants); `tenant=` is the same
    gpus>=N, gpus<=N   jobs asking for at least / at most N GPUs (`gpus=N`: exactly N)
    state=S1,S2        jobs whose recorded final state is one of these (any case), for the
                       traces that record one (Philly's log, Helios, Acme, Alibaba PAI)

For example `--trace-filter "window=0:30d vc=vc6YE,vcLJZ gpus>=8 state=COMPLETED"`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SYNTAX = "window=START:END vc=A,B gpus>=N gpus<=N state=S1,S2"
_CLAUSE = re.compile(r"^([A-Za-z_-]+)(>=|<=|=)(.*)$")
_SPAN = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)([smhd]?)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_KEYS = {"window": "window", "vc": "tenant", "tenant": "tenant", "vcs": "tenant",
         "tenants": "tenant", "gpus": "gpus", "state": "state", "states": "state"}


class FilterError(ValueError):
    """A --trace-filter expression that cannot be understood; says what was expected."""


@dataclass(frozen=True)
class TraceFilter:
    """Which jobs of a trace to keep; None for a cut that is not made."""

    text: str = ""
    start_s: float | None = None
    end_s: float | None = None
    tenants: frozenset[str] | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None
    states: frozenset[str] | None = None  # upper case

    def admits(self, offset_s: float, tenant: str, gpus: int, state: str | None) -> bool:
        """Whether a job submitted `offset_s` after the trace's first submission is kept."""
        if self.start_s is not None and offset_s < self.start_s:
            return False
        if self.end_s is not None and offset_s >= self.end_s:
            return False
        if self.tenants is not None and tenant not in self.tenants:
            return False
        if self.min_gpus is not None and gpus < self.min_gpus:
            return False
        if self.max_gpus is not None and gpus > self.max_gpus:
            return False
        return self.states is None or (state is not None and state.upper() in self.states)

    @property
    def shift_s(self) -> float:
        """How far the kept jobs' times move back: the window's start."""
        return self.start_s or 0.0


def parse_filter(text: str) -> TraceFilter:
    """The filter an expression describes, or a FilterError quoting the bad clause."""
    clauses = [c for c in re.split(r"[\s;]+", re.sub(r"\s*(>=|<=|=)\s*", r"\1", text.strip()))
               if c]
    if not clauses:
        raise FilterError(f"trace filter {text!r} is empty; expected clauses like {SYNTAX}")
    start_s = end_s = None
    tenants = states = None
    min_gpus = max_gpus = None
    seen: set[str] = set()
    for clause in clauses:
        m = _CLAUSE.match(clause)
        if m is None:
            raise _error(text, clause, f"expected KEY=VALUE (or gpus>=N, gpus<=N); {SYNTAX}")
        name, op, value = m.group(1).lower(), m.group(2), m.group(3)
        key = _KEYS.get(name)
        if key is None:
            raise _error(text, clause, f"unknown key {name!r}; expected window, vc (or tenant), "
                                       "gpus or state")
        slot = f"{key}{op}" if key == "gpus" else key
        if slot in seen or (key == "gpus" and ("gpus=" in seen or (op == "=" and (
                "gpus>=" in seen or "gpus<=" in seen)))):
            raise _error(text, clause, f"{name} is given twice")
        seen.add(slot)
        if op != "=" and key != "gpus":
            raise _error(text, clause, f"{name} takes '=', not {op!r}")
        if key == "window":
            start_s, end_s = _window(text, clause, value)
        elif key in ("tenant", "state"):
            names = [v.strip() for v in value.split(",")]
            if not all(names):
                raise _error(text, clause, f"expected {name}=A,B with no empty name")
            if key == "state":
                states = frozenset(n.upper() for n in names)
            else:
                tenants = frozenset(names)
        else:
            count = _gpus(text, clause, value)
            if op in (">=", "="):
                min_gpus = count
            if op in ("<=", "="):
                max_gpus = count
    flt = TraceFilter(text.strip(), start_s, end_s, tenants, min_gpus, max_gpus, states)
    if flt.min_gpus is not None and flt.max_gpus is not None and flt.min_gpus > flt.max_gpus:
        raise FilterError(f"trace filter {text!r}: gpus>={flt.min_gpus} and gpus<={flt.max_gpus}"
                          " keep no job")
    return flt


def _error(text: str, clause: str, problem: str) -> FilterError:
    where = f"{clause!r} in {text!r}" if clause != text.strip() else repr(clause)
    return FilterError(f"trace filter {where}: {problem}")


def _span(text: str, clause: str, value: str) -> float:
    m = _SPAN.match(value.strip())
    if m is None:
        raise _error(text, clause, f"expected a time such as 3600, 90m, 12h or 7d, got {value!r}")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not math.isfinite(seconds):
        raise _error(text, clause, f"time {value!r} is too large")
    return seconds


def _window(text: str, clause: str, value: str) -> tuple[float | None, float | None]:
    if value.count(":") != 1:
        raise _error(text, clause, "expected window=START:END (either may be empty), "
                                   f"got {value!r}")
    first, last = value.split(":")
    start = _span(text, clause, first) if first.strip() else None
    end = _span(text, clause, last) if last.strip() else None
    if start is None and end is None:
        raise _error(text, clause, "window=: cuts nothing; give START, END or both")
    if start is not None and end is not None and end <= start:
        raise _error(text, clause, "the window ends before it starts")
    return start, end


def _gpus(text: str, clause: str, value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise _error(text, clause, f"expected a whole number of GPUs >= 1, got {value!r}")
    return count
