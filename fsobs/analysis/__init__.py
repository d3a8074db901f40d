"""Analyses over a run: pure functions returning DataFrames and typed results (no torch).

Their JSON objects and text reports live in :mod:`fsobs.report`."""

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
