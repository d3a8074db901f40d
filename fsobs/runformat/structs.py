"""Parsed JSON checked against a msgspec Struct, with errors that name the field first.

msgspec says where a value went wrong as a path (``Expected `int`, got `float` - at
`$.seq_lengths[0]```); the run format's errors name the field and the value instead
(``seq_lengths must be an integer, got 1e+300``), as every other check of a run file does.
:func:`convert` gives that one message for each kind of msgspec error::

    Expected `int | null`, got `str` - at `$.a.b`   ->  a.b must be an integer, got 'x'
    Expected `int`, got `float` - at `$.a[3]`       ->  a must be an integer, got 1.5
    Object contains unknown field `c` - at `$.a`    ->  unknown field 'a.c'
    Object missing required field `d`               ->  d is missing

What ``__post_init__`` raises (a range, two fields that disagree) keeps its own words; a
:class:`FieldError` raised there keeps its field too. Every error of :func:`convert` is a
:class:`FieldError`: its ``field`` names the field for the error's ``field=`` (run.json).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

_EXPECTED = re.compile(r"^Expected `(?P<kinds>[^`]+)`, got `(?P<got>[^`]+)`")
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


class FieldError(ValueError):
    """A bad field of a run-format file: ``field`` names it (empty: the whole object); the
    message names it too (module docstring)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def convert(obj: object, kind: type[T]) -> T:
    """``obj`` (parsed JSON) as ``kind`` (a msgspec Struct or type), strictly (no str -> int);
    :class:`FieldError` naming the field (module docstring)."""
    try:
        return msgspec.convert(obj, kind, strict=True)
    except msgspec.ValidationError as exc:
        if isinstance(exc.__cause__, FieldError):  # a rule of __post_init__, naming its field
            raise exc.__cause__ from None
        raise FieldError(*located(str(exc), obj)) from None


def message(error: str, obj: object) -> str:
    """msgspec's ``error`` about ``obj`` as a run-format message (module docstring)."""
    return located(error, obj)[1]


def located(error: str, obj: object) -> tuple[str, str]:
    """The field that msgspec's ``error`` about ``obj`` names, and the run-format message."""
    at = _AT.search(error)
    text = error[: at.start()] if at else error
    field, value = _walk(obj, at.group("path") if at else "")
    if match := _UNKNOWN.match(text):
        name = _join(field, match.group("name"))
        return name, f"unknown field {name!r}"
    if match := _MISSING.match(text):
        name = _join(field, match.group("name"))
        return name, f"{name} is missing"
    if match := _EXPECTED.match(text):
        kinds = [k for k in match.group("kinds").split(" | ") if k != "null"]
        wanted = " or ".join(_KINDS.get(k, k) for k in kinds)
        return field, f"{field or 'the value'} must be {wanted}, got {value!r}"
    return field, f"{field}: {text}" if field else text


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
