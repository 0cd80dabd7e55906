"""Input people write: each JSON key once, strict types, and errors in Loom's words (the
field, the value given, what is allowed), never pydantic's text or its documentation link."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.codec import CodecError, decode_submission
from schemas.job import SubmitJob
from schemas.tenants import TenantsFileError, load_tenants
from schemas.userinput import DuplicateKeyError, explain, loads_unique

JOB: dict[str, Any] = {"model": "resnet50", "gpus": 2, "iterations": 100,
                       "iteration_time_s": 0.5}


def _submit(payload: bytes) -> SubmitJob:
    body = decode_submission(payload, fallback_id="x", now=0.0, producer="p").body
    assert isinstance(body, SubmitJob)
    return body


def _job(**fields: Any) -> bytes:
    return json.dumps({**JOB, **fields}).encode()


@pytest.mark.parametrize(("text", "duplicate"), [
    ('{"a": 1, "a": 2}', "a"),
    ('{"a": {"b": 1, "b": 1}}', "b"),
    ('[{"x": 1}, {"x": 1, "y": 2, "x": 3}]', "x"),
])
def test_a_repeated_key_is_refused_at_any_depth(text: str, duplicate: str) -> None:
    with pytest.raises(DuplicateKeyError, match=f"key '{duplicate}' appears twice"):
        loads_unique(text)


def test_distinct_keys_parse_as_json_does() -> None:
    text = '{"a": 1, "b": {"a": 2}, "c": [{"a": 3}]}'
    assert loads_unique(text) == json.loads(text)


@pytest.mark.parametrize(("fields", "message"), [
    ({"gpus": True}, 'gpus: got true; allowed: a whole number'),
    ({"gpus": "2"}, 'gpus: got "2"; allowed: a whole number'),
    ({"gpus": 2.5}, "gpus: got 2.5; allowed: a whole number"),
    ({"iterations": "100"}, 'iterations: got "100"; allowed: a whole number'),
    ({"iteration_time_s": "0.5"}, 'iteration_time_s: got "0.5"; allowed: a number'),
    ({"iteration_time_s": False}, "iteration_time_s: got false; allowed: a number"),
    ({"best_effort": 1}, "best_effort: got 1; allowed: true or false"),
    ({"gpus": 0}, "gpus: got 0; allowed: a number of at least 1"),
    ({"gpus": 5000}, "gpus: got 5000; allowed: a number of at most 4096"),
    ({"tenant": "a b"}, 'tenant: got "a b"; allowed: letters, digits and _ . : - /'),
    ({"colour": "red"}, "colour: not a field Loom knows; known fields: "),
    ({"min_gpus": 4}, "min_gpus (4) exceeds gpus (2)"),
])
def test_submissions_are_strict_and_refusals_say_field_value_and_what_is_allowed(
        fields: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError) as exc:
        _submit(_job(**fields))
    text = str(exc.value)
    assert message in text
    assert "pydantic" not in text and "Input should" not in text


@pytest.mark.parametrize(("fields", "check"), [
    ({}, lambda j: j.gpus == 2),
    ({"iteration_time_s": 1}, lambda j: j.iteration_time_s == 1.0),  # a whole number is a number
    ({"stage_times_s": [0.1, 0.4]}, lambda j: j.stage_times_s == (0.1, 0.4)),
    ({"scaling": {"1": 1.0, "2": 1.8}, "min_gpus": 1, "max_gpus": 2},
     lambda j: j.scaling == {1: 1.0, 2: 1.8}),
    ({"command": ["python", "train.py"], "env": {"A": "1"}},
     lambda j: j.command == ("python", "train.py")),
])
def test_well_typed_submissions_still_pass(fields: dict[str, Any], check: Any) -> None:
    assert check(_submit(_job(**fields)))


def test_a_json_envelope_on_the_submit_subject_is_strict_too() -> None:
    env = {"type": "loom.job.submit.v1", "event_id": "e", "occurred_at": 0, "producer": "p",
           "body": {**JOB, "gpus": "2"}}
    with pytest.raises(CodecError, match='gpus: got "2"'):
        _submit(json.dumps(env).encode())


@pytest.mark.parametrize(("payload", "kind"), [
    (b"[1, 2]", "an array"),
    (b'["model", "resnet50"]', "an array"),
    (b'"resnet50"', "a string"),
    (b"8", "a number"),
    (b"true", "true or false"),
    (b"null", "null"),
    (b'  [{"model": "resnet50"}]', "an array"),
])
def test_valid_json_of_the_wrong_shape_is_called_so(payload: bytes, kind: str) -> None:
    with pytest.raises(CodecError) as exc:
        _submit(payload)
    assert "must be a JSON object" in str(exc.value) and f"got {kind}" in str(exc.value)
    assert "msgpack" not in str(exc.value)


def test_a_repeated_key_in_a_submission_is_refused() -> None:
    with pytest.raises(CodecError, match="key 'gpus' appears twice"):
        _submit(b'{"model": "m", "gpus": 1, "iterations": 1, "iteration_time_s": 1, "gpus": 8}')


@pytest.mark.parametrize(("name", "text", "message"), [
    ("t.json", '{"tenants": {"nlp": {"weight": "2"}}}',
     "tenant 'nlp': weight: got \"2\"; allowed: a number"),
    ("t.json", '{"tenants": {"nlp": {"max_gpus": true}}}',
     "tenant 'nlp': max_gpus: got true; allowed: a whole number"),
    ("t.toml", '[tenants.nlp]\nweight = "2"\n',
     "tenant 'nlp': weight: got \"2\"; allowed: a number"),
    ("t.json", '{"tenants": {"nlp": {"weight": 2, "weight": 3}}}',
     "key 'weight' appears twice"),
    ("t.json", '{"tenants": {"nlp": {}}, "tenants": {}}', "key 'tenants' appears twice"),
])
def test_tenants_files_are_strict_and_refuse_repeated_keys(
        tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TenantsFileError) as exc:
        load_tenants(path)
    assert str(exc.value).startswith(f"{path}: ") and message in str(exc.value)


def test_explain_counts_what_it_leaves_out() -> None:
    bad = {"model": "a b", "gpus": "x", "iterations": "y", "iteration_time_s": "z",
           "priority": "p", "weight": "w", "tenant": "t t"}
    with pytest.raises(ValidationError) as exc:
        SubmitJob.model_validate_json(json.dumps(bad), strict=True)
    assert explain(exc.value, most=2).endswith("; and 5 more")
