"""Command-line flags generated from config dataclasses (no torch).

A knob is declared once, as a field of its component's config: its type, its default and, in
the docstring under it, what it does. A :class:`Section` names the fields of one config that
a command offers as flags and each flag's name; :func:`add_section` makes the flags from the
fields (like torchtitan's ``config/manager.py``, which derives its CLI from the job config's
dataclasses):

- the type from the field's annotation: ``int``, ``float``, ``str``, ``Path`` (a string), a
  ``Literal`` (its values are the choices), ``X | None`` as ``X``; a ``bool`` is a switch;
- the help from the first paragraph of the field's docstring, with the field's default;
- every flag defaults to None (not given), so :func:`section_values` returns only the fields
  given on the command line and the config keeps its own defaults for the others.

A section with a ``toggle`` (the ``enabled`` switch of an optimizer toggle) refuses its other
flags without it, naming the flag to add (``--balance-window needs --balance``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from fsobs.errors import FsobsError
from fsobs.runformat.structs import optional_of

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


@dataclass(frozen=True)
class Section:
    """Fields of one config dataclass offered as flags."""

    config: type[Any]
    """The config dataclass that declares the fields."""
    flags: Mapping[str, str]
    """Field name -> its flag (``{"window": "--balance-window"}``)."""
    toggle: str | None = None
    """A bool field whose flag every other flag of the section needs (``enabled``)."""

    def __post_init__(self) -> None:
        names = {f.name for f in dataclasses.fields(self.config)}
        unknown = sorted(set(self.flags) - names)
        assert not unknown, f"{self.config.__name__} has no field {unknown[0]}"
        assert self.toggle is None or self.toggle in self.flags


def add_section(parser: argparse.ArgumentParser, section: Section, title: str) -> None:
    """Add ``section``'s flags to ``parser``, in a group named ``title``."""
    group = parser.add_argument_group(title)
    hints = get_type_hints(section.config)
    docs = field_docs(section.config)
    defaults = {f.name: f.default for f in dataclasses.fields(section.config)}
    for name, flag in section.flags.items():
        text = help_text(docs.get(name, ""))
        kind = optional_of(hints[name])
        if kind is bool:
            group.add_argument(flag, action="store_true", default=None, help=text)
            continue
        default = defaults[name]
        if default is not None and default is not dataclasses.MISSING:
            text = f"{text.removesuffix('.')} (default: {default})"
        options: dict[str, Any] = {"default": None, "help": text}
        if get_origin(kind) is Literal:
            options["choices"] = list(get_args(kind))
        else:
            options["type"] = str if kind is Path else kind
            options["metavar"] = name.upper()
        group.add_argument(flag, **options)


def section_values(args: argparse.Namespace, section: Section) -> dict[str, Any]:
    """The fields of ``section`` given on the command line, by field name; FsobsError when a
    flag is given without the section's toggle."""
    given = {
        name: value
        for name, flag in section.flags.items()
        if (value := getattr(args, _dest(flag))) is not None
    }
    if section.toggle is not None and section.toggle not in given:
        for name in given:
            raise FsobsError(f"{section.flags[name]} needs {section.flags[section.toggle]}")
    return given


def field_docs(config: type[Any]) -> dict[str, str]:
    """Field name -> the docstring under it in the class body (PEP 257 attribute docstrings)."""
    (body,) = [
        node.body
        for node in _module_tree(inspect.getfile(config)).body
        if isinstance(node, ast.ClassDef) and node.name == config.__name__
    ]
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


@functools.cache
def _module_tree(path: str) -> ast.Module:
    """A module's syntax tree, parsed once per command (``inspect.getsource`` would tokenize
    the module again for every class)."""
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def help_text(doc: str) -> str:
    """A docstring's first paragraph on one line, reST roles and literals as plain text, ``%``
    escaped for argparse."""
    first = " ".join(doc.split("\n\n")[0].split())
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", first)).replace("%", "%%")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
