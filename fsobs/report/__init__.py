"""The reports of ``fsobs analyze``, ``compare`` and ``whatif``: each result as one JSON object
(strict JSON, keys and units stable across versions) and as text for people (rich tables).

:mod:`.analysis` renders an :class:`~fsobs.analysis.Analysis` (and words its findings),
:mod:`.comparison` a :class:`~fsobs.analysis.Comparison`, :mod:`.whatif` a
:class:`~fsobs.analysis.WhatIf`; ``_format`` and ``_json`` hold what they share. The arrows
point one way: this package reads :mod:`fsobs.analysis`, which never imports it.

The names load on first use (PEP 562 ``__getattr__``), so that
``fsobs analyze`` imports the report of an analysis without those of a comparison or a what-if.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsobs._lazy import lazy_attributes

if TYPE_CHECKING:
    from fsobs.report._alltoall import ALLTOALL_COLUMNS
    from fsobs.report._windows import capture_findings
    from fsobs.report.analysis import (
        EMBEDDING_TOTAL_NOTE,
        WHOLE_TRACE_NOTE,
        NextStep,
        applied_already,
        causes_unknown_line,
        dominant_class,
        findings,
        next_step,
        render,
        to_json,
    )
    from fsobs.report.comparison import compare_json, render_comparison, toggles_line
    from fsobs.report.whatif import render_whatif, whatif_json

_SOURCES = {
    "._alltoall": ("ALLTOALL_COLUMNS",),
    "._windows": ("capture_findings",),
    ".analysis": (
        "EMBEDDING_TOTAL_NOTE",
        "WHOLE_TRACE_NOTE",
        "NextStep",
        "applied_already",
        "causes_unknown_line",
        "dominant_class",
        "findings",
        "next_step",
        "render",
        "to_json",
    ),
    ".comparison": ("compare_json", "render_comparison", "toggles_line"),
    ".whatif": ("render_whatif", "whatif_json"),
}

__all__ = [
    "ALLTOALL_COLUMNS",
    "EMBEDDING_TOTAL_NOTE",
    "WHOLE_TRACE_NOTE",
    "NextStep",
    "applied_already",
    "capture_findings",
    "causes_unknown_line",
    "compare_json",
    "dominant_class",
    "findings",
    "next_step",
    "render",
    "render_comparison",
    "render_whatif",
    "to_json",
    "toggles_line",
    "whatif_json",
]

_LAZY = {name: module for module, names in _SOURCES.items() for name in names}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
