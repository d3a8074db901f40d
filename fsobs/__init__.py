"""fsobs: FreeScale observability — computational bubbles in distributed training traces.

The analysis and trace names load on first use (PEP 562 ``__getattr__``), so that importing a
light submodule such as :mod:`fsobs.cli` or :mod:`fsobs.errors` does not import pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsobs._lazy import lazy_attributes
from fsobs.errors import (
    DuplicateRankError,
    EmptyRunError,
    FsobsError,
    MissingRankError,
    RunError,
    TraceFormatError,
    TraceReadError,
    WorldSizeMismatchError,
)

if TYPE_CHECKING:
    from fsobs.analysis import Analysis, BubbleConfig, Comparison, analyze, analyze_path, compare
    from fsobs.trace import LoadConfig, RankTrace, Run, load_rank, load_run

__all__ = [
    "Analysis",
    "BubbleConfig",
    "Comparison",
    "DuplicateRankError",
    "EmptyRunError",
    "FsobsError",
    "LoadConfig",
    "MissingRankError",
    "RankTrace",
    "Run",
    "RunError",
    "TraceFormatError",
    "TraceReadError",
    "WorldSizeMismatchError",
    "analyze",
    "analyze_path",
    "compare",
    "load_rank",
    "load_run",
]

_LAZY = {
    "Analysis": "fsobs.analysis",
    "BubbleConfig": "fsobs.analysis",
    "Comparison": "fsobs.analysis",
    "analyze": "fsobs.analysis",
    "analyze_path": "fsobs.analysis",
    "compare": "fsobs.analysis",
    "LoadConfig": "fsobs.trace",
    "RankTrace": "fsobs.trace",
    "Run": "fsobs.trace",
    "load_rank": "fsobs.trace",
    "load_run": "fsobs.trace",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
