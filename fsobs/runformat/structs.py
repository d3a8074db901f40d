"""The run format's files read by msgspec (no torch): a bad value is one error naming its field.

A file's object is converted to its ``msgspec.Struct`` (types, unknown and missing fields
checked by msgspec; the rules between fields in the Struct's ``__post_init__``, raising
:class:`FieldError`). :func:`error_field` turns msgspec's error into the dotted field and the
message: ``Expected `int`, got `str` - at `$.hosts[0]``` names ``hosts[0]``, ``Object contains
unknown field `x``` names ``x``, a :class:`FieldError` of a ``__post_init__`` its own field.
"""

from __future__ import annotations

import re

import msgspec

_NAMED = re.compile(r"^Object (?:contains unknown|missing required) field `(?P<name>[^`]+)`")


class FieldError(ValueError):
    """A bad field of a run-format file: ``field`` names it, the message says what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field}: {message}")
        self.field = field
        self.message = message


def error_field(exc: msgspec.ValidationError) -> tuple[str, str]:
    """The dotted field that ``exc`` names (empty: the object itself) and its message without
    the place."""
    message, sep, place = str(exc).partition(" - at `$")
    path = place.removesuffix("`").lstrip(".") if sep else ""
    cause = exc.__cause__
    if isinstance(cause, FieldError):  # a rule of the Struct's __post_init__
        return _join(path, cause.field), cause.message
    named = _NAMED.match(message)
    return (_join(path, named["name"]) if named else path), message


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field
