"""Parsed JSON checked against a msgspec Struct or a config dataclass, with errors that name
the field.

msgspec says where a value went wrong as a path (``Expected `int`, got `float` - at
`$.seq_lengths[0]```); the run format's errors name the field and the value instead, as every
other check of a run file or config does. :func:`convert` gives one
:class:`~optim.errors.FieldError` (``field``, ``reason``; the message ``field: reason``) for each
kind of error::

    Expected `int | null`, got `str` - at `$.a.b`   ->  a.b: must be an integer, got 'x'
    Expected `int`, got `float` - at `$.a[3]`       ->  a: must be an integer, got 1.5
    Invalid enum value 'z' - at `$.a.mode`          ->  a.mode: must be one of ['x', 'y'], got 'z'
    Object contains unknown field `c` - at `$.a`    ->  a.c: unknown field; expected one of [...]
    Object missing required field `d`               ->  d: required, but missing

A :class:`FieldError` that ``__post_init__`` raises (a range, two fields that disagree) keeps its
words, and its field is named from the top (``data.num_items``). Dataclasses get two checks that
msgspec leaves to Structs: an unknown field is refused, and so is a float that is not finite
(JSON has no NaN; ``json.loads`` reads one). A ``Path`` field takes a string.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import msgspec

from optim.errors import FieldError

__all__ = ["FieldError", "convert", "optional_of"]

T = TypeVar("T")

_EXPECTED = re.compile(r"^Expected `(?P<kinds>[^`]+)`, got `(?P<got>[^`]+)`")
_ENUM = re.compile(r"^Invalid enum value ")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.(?P<key>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<index>\d+)\]")
_KINDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "an object",
}


def convert(obj: object, kind: type[T]) -> T:
    """``obj`` (parsed JSON) as ``kind`` (a msgspec Struct, a dataclass, or a type),
    strictly (no str -> int); :class:`FieldError` naming the field (module docstring)."""
    _check_dataclass(obj, kind, "")
    try:
        return msgspec.convert(obj, kind, strict=True, dec_hook=_path)
    except msgspec.ValidationError as exc:
        at = _AT.search(str(exc))
        if isinstance(exc.__cause__, FieldError):  # a rule of __post_init__, naming its field
            raise exc.__cause__.within(_walk(obj, at.group("path") if at else "")[0]) from None
        raise _located(str(exc), obj, kind) from None


def _located(error: str, obj: object, kind: object) -> FieldError:
    """msgspec's ``error`` about ``obj`` (converted to ``kind``) in the run format's words."""
    at = _AT.search(error)
    text = error[: at.start()] if at else error
    field, value = _walk(obj, at.group("path") if at else "")
    if match := _UNKNOWN.match(text):
        return _unknown(_join(field, match.group("name")), _type_at(kind, field))
    if match := _MISSING.match(text):
        return FieldError(_join(field, match.group("name")), "required, but missing")
    if _ENUM.match(text):
        choices = [a for a in get_args(_type_at(kind, field)) if a is not None]
        return FieldError(field, f"must be one of {choices}, got {value!r}")
    if match := _EXPECTED.match(text):
        kinds = [k for k in match.group("kinds").split(" | ") if k != "null"]
        wanted = " or ".join(_KINDS.get(k, k) for k in kinds)
        return FieldError(field, f"must be {wanted}, got {value!r}")
    return FieldError(field, text)


def _unknown(field: str, holder: object) -> FieldError:
    names = _field_names(holder)
    return FieldError(field, "unknown field" + (f"; expected one of {names}" if names else ""))


def _path(kind: type, value: object) -> Any:
    """msgspec's decoding hook: a ``Path`` field from its string."""
    if kind is not Path:
        raise NotImplementedError
    if not isinstance(value, str):
        raise FieldError("", f"must be a path (a string), got {value!r}")
    return Path(value)


def _check_dataclass(obj: object, kind: object, where: str) -> None:
    """Refuse what msgspec accepts in a dataclass: an unknown field, a float not finite."""
    if isinstance(obj, float) and not math.isfinite(obj):
        raise FieldError(where, f"must be a finite number, got {obj}")
    kind = optional_of(kind)
    if isinstance(obj, list) and get_origin(kind) in (list, tuple):
        for value in obj:
            _check_dataclass(value, get_args(kind)[0], where)
        return
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(obj, dict)):
        return
    hints, names = get_type_hints(kind), _field_names(kind)
    for key, value in obj.items():
        if key not in names:
            raise _unknown(_join(where, str(key)), kind)
        _check_dataclass(value, hints[key], _join(where, key))


def _field_names(kind: object) -> list[str]:
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return [f.name for f in dataclasses.fields(kind) if f.init]
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return list(kind.__struct_fields__)
    return []


def _type_at(kind: object, field: str) -> object:
    """The type of the (dotted) ``field`` of ``kind``: its dataclass or Struct fields' hints."""
    for name in filter(None, field.split(".")):
        kind = optional_of(kind)
        if not isinstance(kind, type) or name not in _field_names(kind):
            return None
        kind = get_type_hints(kind)[name]
        if get_origin(kind) in (list, tuple):  # a list's elements share its name
            kind = get_args(kind)[0]
    return optional_of(kind)


def optional_of(kind: object) -> object:
    """``X`` for ``X | None``; ``kind`` itself otherwise."""
    if get_origin(kind) in (Union, types.UnionType):
        inner = [a for a in get_args(kind) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return kind


def _join(field: str, name: str) -> str:
    return f"{field}.{name}" if field else name


def _walk(obj: object, path: str) -> tuple[str, Any]:
    """The field's name and its value in ``obj`` along msgspec's ``path`` (``.a[0]``): a list
    index names the list (its elements share its name)."""
    field, value = "", obj
    for step in _STEP.finditer(path):
        if step.group("key") is not None:
            field = _join(field, step.group("key"))
            value = value.get(step.group("key")) if isinstance(value, dict) else None
        else:
            index = int(step.group("index"))
            value = value[index] if isinstance(value, list) and index < len(value) else None
    return field, value
