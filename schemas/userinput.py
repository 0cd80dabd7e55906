"""Input people write: JSON whose objects name each key once, and validation errors told in
Loom's words (the field, the value given, what is allowed) rather than pydantic's.

Every reader of user JSON (the submit subject, `loom submit`, tenants files, cluster files)
parses with `loads_unique`, so `{"gpus": 1, "gpus": 8}` is refused instead of the last key
silently winning, and validates in pydantic's strict JSON mode, so `"gpus": true` or
`"gpus": "2"` is refused instead of coerced into a number.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from schemas.cluster import NODE_ID_PATTERN
from schemas.job import JOB_ID_PATTERN, NAME_PATTERN


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice."""


def _unique(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise DuplicateKeyError(f"key {key[:40]!r} appears twice in one JSON object; "
                                    "give each key once")
        obj[key] = value
    return obj


def loads_unique(text: str | bytes, **kwargs: Any) -> Any:
    """`json.loads`, refusing an object with a repeated key (DuplicateKeyError)."""
    return json.loads(text, object_pairs_hook=_unique, **kwargs)


def _shown(value: Any) -> str:
    """A value as the user wrote it (JSON spelling where it has one), cut short."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# The patterns of Loom's names, in words.
_PATTERNS = {
    NAME_PATTERN: "letters, digits and _ . : - / (no spaces)",
    JOB_ID_PATTERN: "a letter or digit, then letters, digits and _ . : - (no spaces or /)",
    NODE_ID_PATTERN: "letters, digits, _ and - (no spaces)",
}


# pydantic error type -> what is allowed, in Loom's words (ctx: the error's context values).
_ALLOWED: dict[str, Callable[[dict[str, Any]], str]] = {
    "greater_than_equal": lambda c: f"a number of at least {c.get('ge')}",
    "greater_than": lambda c: f"a number greater than {c.get('gt')}",
    "less_than_equal": lambda c: f"a number of at most {c.get('le')}",
    "less_than": lambda c: f"a number less than {c.get('lt')}",
    "int_type": lambda _: "a whole number (not a string or true/false)",
    "int_parsing": lambda _: "a whole number",
    "int_from_float": lambda _: "a whole number",
    "float_type": lambda _: "a number (not a string or true/false)",
    "float_parsing": lambda _: "a number",
    "finite_number": lambda _: "a finite number",
    "bool_type": lambda _: "true or false",
    "bool_parsing": lambda _: "true or false",
    "string_type": lambda _: "a string",
    "string_too_short": lambda c: ("a non-empty string" if c.get("min_length") == 1
                                   else f"a string of at least {c.get('min_length')} characters"),
    "string_too_long": lambda c: f"a string of at most {c.get('max_length')} characters",
    "string_pattern_mismatch": lambda c: _PATTERNS.get(str(c.get("pattern")),
                                                       f"a string matching {c.get('pattern')}"),
    "too_short": lambda c: f"at least {c.get('min_length')} items",
    "too_long": lambda c: f"at most {c.get('max_length')} items",
    "list_type": lambda _: "a list",
    "tuple_type": lambda _: "a list",
    "dict_type": lambda _: "an object",
    "model_type": lambda _: "an object",
    "model_attributes_type": lambda _: "an object",
    "literal_error": lambda c: f"one of {c.get('expected')}",
    "enum": lambda c: f"one of {c.get('expected')}",
}


def describe(err: ErrorDetails, fields: Iterable[str] = ()) -> str:
    """One validation error as "gpus: got true; allowed: a whole number ...".

    `fields` are the names a model accepts, listed when a key is not one of them."""
    loc = ".".join(str(p)[:40] for p in err["loc"] if p != "[key]") or "(top level)"
    kind = err["type"]
    if kind == "missing":
        return f"{loc}: required, but missing"
    if kind == "extra_forbidden":
        known = sorted(fields)
        listed = f"; known fields: {', '.join(known)}" if known else ""
        return f"{loc}: not a field Loom knows{listed}"
    if kind in ("value_error", "assertion_error"):  # the model's own check: its own words
        reason = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return f"{loc}: {reason}"
    allowed = _ALLOWED.get(kind)
    what = allowed(dict(err.get("ctx") or {})) if allowed else err["msg"].lower()
    return f"{loc}: got {_shown(err.get('input'))}; allowed: {what}"


def explain(exc: ValidationError, fields: Iterable[str] = (), most: int = 5) -> str:
    """A ValidationError's first `most` problems in Loom's words, "; "-separated."""
    names = list(fields)
    errors = exc.errors(include_url=False)
    parts = [describe(err, names) for err in errors[:most]]
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
