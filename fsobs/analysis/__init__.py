"""Analyses over a run: pure functions returning DataFrames (no torch)."""

from fsobs.analysis.ab import Comparison, compare, compare_json
from fsobs.analysis.bubbles.parts import BubbleConfig
from fsobs.analysis.costfit import CostFit, fit_cost, fit_points
from fsobs.analysis.hta_compat import HtaMetrics, combine_hta, rank_hta
from fsobs.analysis.pipeline import Analysis, analyze, analyze_path, analyze_summary, kpis
from fsobs.analysis.summary import RankSummary, summarize_path, summarize_rank, summarize_run
from fsobs.analysis.whatif.predict import Prediction, WhatIf, whatif, whatif_json

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
    "compare_json",
    "fit_cost",
    "fit_points",
    "kpis",
    "rank_hta",
    "summarize_path",
    "summarize_rank",
    "summarize_run",
    "whatif",
    "whatif_json",
]
