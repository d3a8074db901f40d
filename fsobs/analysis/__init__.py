"""Analyses over a loaded :class:`~fsobs.trace.Run`: pure functions returning DataFrames."""

from fsobs.analysis.analyze import Analysis, HtaMetrics, analyze, hta_metrics, rank_overview
from fsobs.analysis.hta_compat import (
    comm_comp_overlap,
    hta_views,
    idle_time_breakdown,
    temporal_breakdown,
)

__all__ = [
    "Analysis",
    "HtaMetrics",
    "analyze",
    "comm_comp_overlap",
    "hta_metrics",
    "hta_views",
    "idle_time_breakdown",
    "rank_overview",
    "temporal_breakdown",
]
