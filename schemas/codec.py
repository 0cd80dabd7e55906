"""Wire format: msgpack envelopes; the submit subject also takes JSON from people."""

from __future__ import annotations

import json
from typing import Any

import msgpack
from pydantic import ValidationError

from schemas.events import EVENT_TYPES, Envelope, validate_envelope
from schemas.job import SubmitJob

SUBMIT_TYPE = "loom.job.submit.v1"


class CodecError(ValueError):
    """A payload that cannot become an Envelope; the message names what is wrong."""


def encode(env: Envelope) -> bytes:
    return msgpack.packb(env.to_dict(), use_bin_type=True)  # type: ignore[no-any-return]


def decode(payload: bytes) -> Envelope:
    try:
        # Non-string keys are allowed: an elastic job's scaling profile is keyed by GPU count.
        # Whatever comes out is validated field by field below.
        data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"not msgpack: {exc}") from exc
    return _validate(data)


def decode_submission(payload: bytes, *, fallback_id: str, now: float, producer: str) -> Envelope:
    """Decode a message on the submit subject: msgpack envelope, JSON envelope or bare JSON job.

    A bare job (what `nats pub loom.jobs.submit '{"model": ...}'` sends) is wrapped in an
    envelope whose id is `fallback_id` (the Nats-Msg-Id header or the stream sequence).
    """
    text = payload.lstrip()
    if not text.startswith(b"{"):
        return decode(payload)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise CodecError(f"invalid JSON at {where}: {exc.msg}") from exc
    except UnicodeDecodeError as exc:
        raise CodecError(f"invalid JSON: not UTF-8 at byte {exc.start}") from exc
    except RecursionError as exc:
        raise CodecError("invalid JSON: nested too deeply") from exc
    if not isinstance(data, dict):
        raise CodecError("a submission must be a JSON object")
    if "type" in data and "body" in data:
        return _validate(data)
    try:
        body = SubmitJob.model_validate(data)
    except ValidationError as exc:
        raise CodecError(f"invalid job: {_explain(exc)}") from exc
    return Envelope(SUBMIT_TYPE, fallback_id, None, now, producer, body)


def _validate(data: Any) -> Envelope:
    if not isinstance(data, dict):
        raise CodecError("an envelope must be a map")
    etype = data.get("type")
    if not isinstance(etype, str) or etype not in EVENT_TYPES:
        raise CodecError(f"unknown event type {etype!r:.80}")
    try:
        return validate_envelope(data)
    except ValidationError as exc:
        raise CodecError(f"invalid {etype}: {_explain(exc)}") from exc


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
