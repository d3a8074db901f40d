"""The reports of ``fsobs analyze``, ``compare`` and ``whatif``: each result as one JSON object
(strict JSON, keys and units stable across versions) and as text for people (rich tables).

:mod:`.analysis` renders an :class:`~fsobs.analysis.Analysis` (and words its findings),
:mod:`.comparison` a :class:`~fsobs.analysis.Comparison`, :mod:`.whatif` a
:class:`~fsobs.analysis.WhatIf`; ``_format`` and ``_json`` hold what they share. The arrows
point one way: this package reads :mod:`fsobs.analysis`, which never imports it.
"""

from fsobs.report._alltoall import COLUMNS as ALLTOALL_COLUMNS
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
