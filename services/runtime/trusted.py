"""Bodies a core builds in-process, not validated again.

Validation is paid where a message crosses a trust boundary: a bus's decode (NATS), the
submit subject, replay input. A core that builds a body from its own typed state, itself
built from validated input, need not pay it again on every plan, launch and transition it
makes. `trusted` builds the same model instance validation would, from fields that must
already be what validation would leave: the body's own names, each of its declared type. A
name the body lacks, or a required field left out, raises TypeError at once; with
`LOOM_CHECK_TRUSTED=1` (the test suite sets it) every body is also validated, and one that
validation would refuse or change (an int where a float belongs, a list for a tuple) raises.
The body holds the containers it is given where validation would copy them: a caller hands
over a dict it no longer changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

from pydantic import BaseModel

__all__ = ["CHECK", "trusted"]

Body = TypeVar("Body", bound=BaseModel)

CHECK = os.environ.get("LOOM_CHECK_TRUSTED", "") not in ("", "0")


class _Shape(NamedTuple):
    """A body class's fields as `trusted` fills them."""

    template: dict[str, Any]  # every field in order, with its default (None where required)
    required: frozenset[str]
    factories: tuple[tuple[str, Callable[[], Any]], ...]  # defaults made anew for each body


_SHAPES: dict[type, _Shape] = {}
_new_object = object.__new__  # pydantic's models have no `__new__` of their own
_set_slot = object.__setattr__


def trusted(cls: type[Body], **fields: Any) -> Body:
    """A `cls` body of `fields` (see the module's docstring), without validating them."""
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = _shape_of(cls)
    body = shape.template.copy()  # the fields' order, as validation leaves them
    body.update(fields)
    if len(body) != len(shape.template) or not fields.keys() >= shape.required:
        raise TypeError(_misfit(cls, shape, fields))
    for name, factory in shape.factories:
        if name not in fields:
            body[name] = factory()
    if CHECK:
        _check(cls, body)
    made = _new_object(cls)
    _set_slot(made, "__dict__", body)
    _set_slot(made, "__pydantic_fields_set__", set(fields))
    _set_slot(made, "__pydantic_extra__", None)
    _set_slot(made, "__pydantic_private__", None)
    return made


def _shape_of(cls: type[BaseModel]) -> _Shape:
    if cls.__private_attributes__ or cls.model_config.get("extra") == "allow":
        raise TypeError(f"{cls.__name__} has private or extra fields: trusted builds neither")
    template: dict[str, Any] = {}
    required: set[str] = set()
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, info in cls.model_fields.items():
        template[name] = None
        if info.is_required():
            required.add(name)
        elif info.default_factory is not None:
            factories.append((name, cast("Callable[[], Any]", info.default_factory)))
        else:
            template[name] = info.default
    return _Shape(template, frozenset(required), tuple(factories))


def _misfit(cls: type[BaseModel], shape: _Shape, fields: dict[str, Any]) -> str:
    unknown = sorted(name for name in fields if name not in shape.template)
    missing = sorted(name for name in shape.required if name not in fields)
    parts = ([f"no field {', '.join(unknown)}"] if unknown else []) + (
        [f"{', '.join(missing)} required"] if missing else [])
    return f"{cls.__name__}: {'; '.join(parts)}"


def _check(cls: type[BaseModel], body: dict[str, Any]) -> None:
    """Raise unless validating `body` gives back the same fields, of the same types."""
    validated = cls.model_validate(body).__dict__
    for name, value in body.items():
        if not _same(value, validated[name]):
            raise TypeError(f"{cls.__name__}: field {name} is {value!r} "
                            f"({type(value).__name__}), validated {validated[name]!r} "
                            f"({type(validated[name]).__name__})")


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 == 1.0, but not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    return bool(a == b)
