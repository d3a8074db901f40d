"""One entry point that runs every analysis on a loaded run."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fsobs.analysis import hta_compat
from fsobs.trace.schema import Run


@dataclass
class HtaMetrics:
    """HTA-compatible GPU metrics (see :mod:`fsobs.analysis.hta_compat` for the columns)."""

    temporal_breakdown: pd.DataFrame
    comm_comp_overlap: pd.DataFrame
    idle_time_breakdown: pd.DataFrame


@dataclass
class Analysis:
    """Everything fsobs computes for a run."""

    run: Run
    overview: pd.DataFrame
    """Per-rank facts, see :func:`rank_overview`."""
    hta: HtaMetrics | None
    """None for CPU-only runs, where HTA's GPU metrics do not apply."""


def analyze(run: Run) -> Analysis:
    """Analyze a loaded run."""
    hta = hta_metrics(run) if run.device == "gpu" else None
    return Analysis(run=run, overview=rank_overview(run), hta=hta)


def hta_metrics(run: Run) -> HtaMetrics:
    views = hta_compat.hta_views(run)
    return HtaMetrics(
        temporal_breakdown=hta_compat.temporal_breakdown(views),
        comm_comp_overlap=hta_compat.comm_comp_overlap(views),
        idle_time_breakdown=hta_compat.idle_time_breakdown(views),
    )


def rank_overview(run: Run) -> pd.DataFrame:
    """Per rank: events, steps, mean step time, communication events and their total time.

    Columns: rank, host, device, num_events, num_steps, step_time_ms_mean, num_comm_events,
    comm_time_ms (sum of communication event durations; they may overlap).
    """
    rows = []
    for rank, trace in run.ranks.items():
        ev = trace.events
        steps = ev[ev["kind"] == "step"]
        comm = ev[ev["kind"] == "comm"]
        rows.append(
            {
                "rank": rank,
                "host": trace.host_name or "",
                "device": trace.device,
                "num_events": len(ev),
                "num_steps": len(steps),
                "step_time_ms_mean": steps["dur_ns"].mean() / 1e6 if len(steps) else float("nan"),
                "num_comm_events": len(comm),
                "comm_time_ms": comm["dur_ns"].sum() / 1e6,
            }
        )
    return pd.DataFrame(rows)
