"""Analyses over a run: pure functions returning DataFrames and typed results (no torch).

Their JSON objects and text reports live in :mod:`fsobs.report`. The names load on first use
(PEP 562 ``__getattr__``), so that importing a light submodule such as
:mod:`fsobs.analysis.fit_shapes` does not import pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fsobs._lazy import lazy_attributes

if TYPE_CHECKING:
    from fsobs.analysis.bubbles.classify import StepBubbles
    from fsobs.analysis.bubbles.optree import op_tree
    from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES, BubbleConfig
    from fsobs.analysis.collectives.alltoall import alltoall_with_data
    from fsobs.analysis.comparison.ab import Comparison, compare
    from fsobs.analysis.costfit import CostFit, fit_cost, fit_points
    from fsobs.analysis.hta_compat import HtaMetrics, combine_hta, rank_hta
    from fsobs.analysis.locality import comm_locality, intra_share
    from fsobs.analysis.pipeline import (
        EMBEDDING_TOTAL,
        Analysis,
        analyze,
        analyze_path,
        analyze_summary,
        kpis,
        kpis_by_role,
    )
    from fsobs.analysis.stragglers.causes import CAUSES
    from fsobs.analysis.summary import RankSummary, summarize_path, summarize_rank, summarize_run
    from fsobs.analysis.whatif.bounds import SplitBounds, run_bounds
    from fsobs.analysis.whatif.predict import TOGGLES, available_toggles, whatif
    from fsobs.analysis.whatif.results import Prediction, WhatIf
    from fsobs.analysis.whatif.splits import BalanceSplit

_SOURCES = {
    ".bubbles.classify": ("StepBubbles",),
    ".bubbles.optree": ("op_tree",),
    ".bubbles.parts": ("BUBBLE_CLASSES", "BubbleConfig"),
    ".collectives.alltoall": ("alltoall_with_data",),
    ".comparison.ab": ("Comparison", "compare"),
    ".costfit": ("CostFit", "fit_cost", "fit_points"),
    ".hta_compat": ("HtaMetrics", "combine_hta", "rank_hta"),
    ".locality": ("comm_locality", "intra_share"),
    ".pipeline": (
        "EMBEDDING_TOTAL",
        "Analysis",
        "analyze",
        "analyze_path",
        "analyze_summary",
        "kpis",
        "kpis_by_role",
    ),
    ".stragglers.causes": ("CAUSES",),
    ".summary": ("RankSummary", "summarize_path", "summarize_rank", "summarize_run"),
    ".whatif.bounds": ("SplitBounds", "run_bounds"),
    ".whatif.predict": ("TOGGLES", "available_toggles", "whatif"),
    ".whatif.results": ("Prediction", "WhatIf"),
    ".whatif.splits": ("BalanceSplit",),
}

__all__ = [
    "BUBBLE_CLASSES",
    "CAUSES",
    "EMBEDDING_TOTAL",
    "TOGGLES",
    "Analysis",
    "BalanceSplit",
    "BubbleConfig",
    "Comparison",
    "CostFit",
    "HtaMetrics",
    "Prediction",
    "RankSummary",
    "SplitBounds",
    "StepBubbles",
    "WhatIf",
    "alltoall_with_data",
    "analyze",
    "analyze_path",
    "analyze_summary",
    "available_toggles",
    "combine_hta",
    "comm_locality",
    "compare",
    "fit_cost",
    "fit_points",
    "intra_share",
    "kpis",
    "kpis_by_role",
    "op_tree",
    "rank_hta",
    "run_bounds",
    "summarize_path",
    "summarize_rank",
    "summarize_run",
    "whatif",
]

# The subpackage ``whatif`` shares its name with the function: it is imported now (it is light),
# so that importing it later cannot bind the name to it, and the name is left to __getattr__.
importlib.import_module("fsobs.analysis.whatif")
del globals()["whatif"]

_LAZY = {name: module for module, names in _SOURCES.items() for name in names}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
