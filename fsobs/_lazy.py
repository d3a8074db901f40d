"""The PEP 562 hooks of fsobs's packages, whose names load on first use (standard library only).

:func:`optim.lazy.lazy_attributes` does the same for ``optim``; ``fsobs``, ``fsobs.trace``,
``fsobs.analysis`` and ``fsobs.report`` keep their own, so that importing them (``fsobs --help``)
imports nothing of ``optim`` (which ``fsobs`` may import, never the reverse).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, sources: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``; ``sources`` maps each lazy name
    to its module, absolute or relative to ``package``. A name is imported once, then kept in
    the package."""

    def __getattr__(name: str) -> Any:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sources[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(sources))

    return __getattr__, __dir__
