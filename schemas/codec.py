"""Wire format: msgpack envelopes; the submit subject also takes JSON from people.

Everything here treats the payload as hostile: its size is checked before it is parsed, its
nesting before it is validated, and each subject accepts only the event types its producers
send (`check_subject`), so a well-formed operator command sent to the submit subject, or a
job-finished event sent as a node status, is refused rather than acted on; on a node's own
subjects the body must name that node (`check_origin`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
from pydantic import ValidationError

from schemas import subjects
from schemas.events import EVENT_TYPES, Envelope, validate_envelope
from schemas.job import SubmitJob
from schemas.userinput import DuplicateKeyError, explain, loads_unique

SUBMIT_TYPE = "loom.job.submit.v1"
# A submission is a job, small even with a Pollux goodput profile (the largest bundled one
# encodes to 13 KB); internal events carry whole plans, so they get the server's max_payload.
MAX_SUBMISSION_BYTES = 64 * 1024
MAX_EVENT_BYTES = 1024 * 1024
# Containers inside containers: a plan's launch's spec's goodput table is 8 deep.
MAX_DEPTH = 12

# What each subject carries: one family of events (the type less its `.vN`). The versions
# come from EVENT_TYPES, so a new `vN` is accepted on its family's subject, with the versions
# before it, without a second list to keep in step. A subject not listed here (a test's own)
# takes any event type.
_FAMILIES: dict[str, str] = {
    subjects.JOB_SUBMIT: "loom.job.submit",
    subjects.JOB_TRANSITION: "loom.job.transition",
    subjects.JOB_FINISHED: "loom.job.finished",
    subjects.JOB_PROGRESS: "loom.job.progress",
    subjects.CYCLE_STARTED: "loom.cycle.started",
    subjects.PLAN_DECIDED: "loom.plan.decided",
    subjects.START_FORECAST: "loom.forecast.start",
    subjects.QUEUE_STATUS: "loom.queue.status",
    subjects.OPERATOR: "loom.ops.command",
    subjects.NODE_STATUS: "loom.node.status",
    subjects.NODE_INFO: "loom.node.info",
    subjects.NODE_HEARTBEAT: "loom.node.heartbeat",
    subjects.NODE_COMMAND_ALL: "loom.node.command",
    f"{subjects.DEADLETTER_PREFIX}.>": "loom.deadletter",
}


def _family(event_type: str) -> str:
    """`loom.job.transition.v2` -> `loom.job.transition`."""
    return event_type.rsplit(".", 1)[0]


SUBJECT_TYPES: dict[str, frozenset[str]] = {
    subject: frozenset(t for t in EVENT_TYPES if _family(t) == name)
    for subject, name in _FAMILIES.items()
}


class CodecError(ValueError):
    """A payload that cannot become an Envelope; the message names what is wrong."""


def encode(env: Envelope) -> bytes:
    return msgpack.packb(env.to_dict(), use_bin_type=True)  # type: ignore[no-any-return]


def decode(payload: bytes, *, max_bytes: int = MAX_EVENT_BYTES) -> Envelope:
    _check_size(payload, max_bytes)
    try:
        # Non-string keys are allowed: an elastic job's scaling profile is keyed by GPU count.
        # Whatever comes out is validated field by field below.
        data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"not msgpack: {type(exc).__name__}: {exc}"[:300]) from exc
    return _validate(data)


def check_origin(subject: str, env: Envelope) -> None:
    """Refuse an event its subject does not carry: the wrong type, or, on a node's own
    subject, a body that names another node (the server proved who published the subject,
    nothing proves the body)."""
    check_subject(subject, env.type)
    node = subjects.node_of(subject)
    named = getattr(env.body, "node_id", None)
    if node is not None and named != node:
        raise CodecError(f"{env.type} on {subject} names node {named!r}: a node speaks only "
                         f"for itself, on loom.node.<its id>.>")


def check_subject(subject: str, event_type: str) -> None:
    """Refuse an event type the subject does not carry (CodecError naming both)."""
    for pattern, allowed in SUBJECT_TYPES.items():
        if subjects.matches(pattern, subject):
            if event_type not in allowed:
                raise CodecError(f"event type {event_type!r} is not accepted on {subject} "
                                 f"(expected {', '.join(sorted(allowed))})")
            return


def _check_size(payload: bytes, max_bytes: int) -> None:
    if len(payload) > max_bytes:
        raise CodecError(f"payload of {len(payload)} bytes exceeds the limit of {max_bytes}")
    if not payload:
        raise CodecError("empty payload")


def _reject_constant(name: str) -> float:
    raise CodecError(f"invalid JSON: {name} is not a number Loom accepts")


def _check_depth(data: Any) -> None:
    """Iteratively, so a hostile payload cannot exhaust the interpreter's stack."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise CodecError(f"nested deeper than {MAX_DEPTH} levels")
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list | tuple))


def decode_submission(payload: bytes, *, fallback_id: str, now: float, producer: str) -> Envelope:
    """Decode a message on the submit subject: msgpack envelope, JSON envelope or bare JSON job.

    A bare job (what `nats pub loom.jobs.submit '{"model": ...}'` sends) is wrapped in an
    envelope whose id is `fallback_id` (the Nats-Msg-Id header or the stream sequence).
    Anything larger than MAX_SUBMISSION_BYTES is refused unread, and an envelope must be a
    submission: no other event type enters through the subject users may publish to.
    """
    _check_size(payload, MAX_SUBMISSION_BYTES)
    text = payload.lstrip()
    if not text.startswith(b"{"):
        _refuse_other_json(text)
        env = decode(payload, max_bytes=MAX_SUBMISSION_BYTES)
        check_subject(subjects.JOB_SUBMIT, env.type)
        return env
    try:
        data = loads_unique(text, parse_constant=_reject_constant)
    except DuplicateKeyError as exc:
        raise CodecError(f"invalid JSON: {exc}") from exc
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise CodecError(f"invalid JSON at {where}: {exc.msg}") from exc
    except UnicodeDecodeError as exc:
        raise CodecError(f"invalid JSON: not UTF-8 at byte {exc.start}") from exc
    except RecursionError as exc:
        raise CodecError("invalid JSON: nested too deeply") from exc
    except CodecError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise CodecError(f"invalid JSON: {exc}"[:300]) from exc
    if not isinstance(data, dict):
        raise CodecError("a submission must be a JSON object")
    if "type" in data and "body" in data:
        env = _validate(data)
        check_subject(subjects.JOB_SUBMIT, env.type)
        _strict_job(json.dumps(data["body"]), f"invalid {env.type}")
        return env
    _check_depth(data)
    body = _strict_job(text, "invalid job")
    return Envelope(SUBMIT_TYPE, fallback_id, None, now, producer, body)


def _strict_job(text: str | bytes, what: str) -> SubmitJob:
    """A job typed by a person, taken as typed: strict ("gpus": "2" or true is refused, not
    coerced), in JSON mode, so arrays fill tuples and object keys fill GPU-count tables."""
    try:
        return SubmitJob.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise CodecError(f"{what}: {explain(exc, SubmitJob.model_fields)}") from exc


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "true or false", type(None): "null"}


def _refuse_other_json(text: bytes) -> None:
    """JSON that is not an object (`[...]`, `"job"`, `8`) is a submission of the wrong shape:
    say so, rather than call it bad msgpack. A msgpack envelope (a map: first byte 0x80-0x8f
    or 0xde/0xdf) is never valid UTF-8 JSON, so this costs it one failed parse."""
    if not text or text[0] >= 0x80:
        return
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return
    kind = _JSON_KINDS.get(type(data), type(data).__name__)
    raise CodecError(f"a submission must be a JSON object of job fields, such as "
                     f'{{"model": "resnet50", "gpus": 1, "iterations": 100, '
                     f'"iteration_time_s": 0.5}}; got {kind}')


def _validate(data: Any) -> Envelope:
    if not isinstance(data, dict):
        raise CodecError("an envelope must be a map")
    etype = data.get("type")
    if not isinstance(etype, str) or etype not in EVENT_TYPES:
        raise CodecError(f"unknown event type {etype!r:.80}")
    _check_depth(data)
    try:
        env = validate_envelope(data)
    except ValidationError as exc:
        raise CodecError(f"invalid {etype}: {_explain(exc)}") from exc
    except (ValueError, TypeError, RecursionError) as exc:
        raise CodecError(f"invalid {etype}: {exc}"[:300]) from exc
    if not math.isfinite(env.occurred_at):
        raise CodecError(f"invalid {etype}: occurred_at must be finite")
    return env


def _explain(exc: ValidationError) -> str:
    return explain(exc)
