"""Analyses over a loaded :class:`~fsobs.trace.Run` (pure functions returning DataFrames; no torch)."""

from fsobs.analysis.hta_compat import (
    comm_comp_overlap,
    hta_views,
    idle_time_breakdown,
    temporal_breakdown,
)

__all__ = ["comm_comp_overlap", "hta_views", "idle_time_breakdown", "temporal_breakdown"]
