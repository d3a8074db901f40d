"""Package attributes that import their module on first use (PEP 562), written once.

A package whose names come from modules that are slow or heavy to import (torch) lists where
each name lives and hands Python the two hooks::

    __getattr__, __dir__ = lazy_attributes(__name__, {"FreeScale": ".freescale"})

The first ``package.FreeScale`` imports ``package.freescale`` and stores the value in the
package, so that later lookups are plain attribute reads. Standard library only: ``optim`` and
``fsobs`` (which may import ``optim``, never the reverse) both use it without importing torch.
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
    to its module, absolute or relative to ``package`` (``".freescale"``)."""

    def __getattr__(name: str) -> Any:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sources[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(sources))

    return __getattr__, __dir__
