"""The reports of ``fsobs analyze``, ``compare`` and ``whatif``: each result as one JSON object
(strict JSON, keys and units stable across versions) and as text for people (rich tables).

:mod:`.analysis` renders an :class:`~fsobs.analysis.Analysis` (and words its findings),
:mod:`.comparison` a :class:`~fsobs.analysis.Comparison`, :mod:`.whatif` a
:class:`~fsobs.analysis.WhatIf`; ``_format`` and ``_json`` hold what they share. The arrows
point one way: this package reads :mod:`fsobs.analysis`, which never imports it.

The names load on first use (PEP 562 ``__getattr__``), so that ``fsobs analyze`` imports the
report of an analysis without those of a comparison or a what-if.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsobs.report._alltoall import COLUMNS as ALLTOALL_COLUMNS
    from fsobs.report._windows import capture_findings
    from fsobs.report.analysis import findings, render, to_json
    from fsobs.report.comparison import compare_json, render_comparison, toggles_line
    from fsobs.report.whatif import render_whatif, whatif_json

__all__ = [
    "ALLTOALL_COLUMNS",
    "capture_findings",
    "compare_json",
    "findings",
    "render",
    "render_comparison",
    "render_whatif",
    "to_json",
    "toggles_line",
    "whatif_json",
]

_LAZY = {
    "ALLTOALL_COLUMNS": ("fsobs.report._alltoall", "COLUMNS"),
    "capture_findings": ("fsobs.report._windows", "capture_findings"),
    "findings": ("fsobs.report.analysis", "findings"),
    "render": ("fsobs.report.analysis", "render"),
    "to_json": ("fsobs.report.analysis", "to_json"),
    "compare_json": ("fsobs.report.comparison", "compare_json"),
    "render_comparison": ("fsobs.report.comparison", "render_comparison"),
    "toggles_line": ("fsobs.report.comparison", "toggles_line"),
    "render_whatif": ("fsobs.report.whatif", "render_whatif"),
    "whatif_json": ("fsobs.report.whatif", "whatif_json"),
}
"""Each name's module, and its name there."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fsobs.report' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
