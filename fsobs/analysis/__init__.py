"""Analyses over a run: pure functions returning DataFrames and typed results (no torch).

Their JSON objects and text reports live in :mod:`fsobs.report`. The names load on first use
(PEP 562 ``__getattr__``), so that importing a light submodule such as
:mod:`fsobs.analysis.fit_shapes` does not import pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsobs.analysis.bubbles.parts import BubbleConfig
    from fsobs.analysis.comparison.ab import Comparison, compare
    from fsobs.analysis.costfit import CostFit, fit_cost, fit_points
    from fsobs.analysis.hta_compat import HtaMetrics, combine_hta, rank_hta
    from fsobs.analysis.pipeline import Analysis, analyze, analyze_path, analyze_summary, kpis
    from fsobs.analysis.summary import RankSummary, summarize_path, summarize_rank, summarize_run
    from fsobs.analysis.whatif.predict import whatif
    from fsobs.analysis.whatif.results import Prediction, WhatIf

__all__ = [
    "Analysis",
    "BubbleConfig",
    "Comparison",
    "CostFit",
    "HtaMetrics",
    "Prediction",
    "RankSummary",
    "WhatIf",
    "analyze",
    "analyze_path",
    "analyze_summary",
    "combine_hta",
    "compare",
    "fit_cost",
    "fit_points",
    "kpis",
    "rank_hta",
    "summarize_path",
    "summarize_rank",
    "summarize_run",
    "whatif",
]

_LAZY = {
    "BubbleConfig": "fsobs.analysis.bubbles.parts",
    "Comparison": "fsobs.analysis.comparison.ab",
    "compare": "fsobs.analysis.comparison.ab",
    "CostFit": "fsobs.analysis.costfit",
    "fit_cost": "fsobs.analysis.costfit",
    "fit_points": "fsobs.analysis.costfit",
    "HtaMetrics": "fsobs.analysis.hta_compat",
    "combine_hta": "fsobs.analysis.hta_compat",
    "rank_hta": "fsobs.analysis.hta_compat",
    "Analysis": "fsobs.analysis.pipeline",
    "analyze": "fsobs.analysis.pipeline",
    "analyze_path": "fsobs.analysis.pipeline",
    "analyze_summary": "fsobs.analysis.pipeline",
    "kpis": "fsobs.analysis.pipeline",
    "RankSummary": "fsobs.analysis.summary",
    "summarize_path": "fsobs.analysis.summary",
    "summarize_rank": "fsobs.analysis.summary",
    "summarize_run": "fsobs.analysis.summary",
    "whatif": "fsobs.analysis.whatif.predict",
    "Prediction": "fsobs.analysis.whatif.results",
    "WhatIf": "fsobs.analysis.whatif.results",
}


# The subpackage ``whatif`` shares its name with the function: it is imported now (it is light),
# so that importing it later cannot bind the name to it, and the name is left to __getattr__.
importlib.import_module("fsobs.analysis.whatif")
del globals()["whatif"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsobs.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
