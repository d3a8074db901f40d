"""One entry point that runs every analysis on a loaded run."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis import hta_compat
from fsobs.analysis.attribution import Attribution, attribute
from fsobs.analysis.bubbles import BubbleConfig, StepBubbles, bubble_intervals, bubble_table
from fsobs.analysis.collectives import Collectives, match_collectives
from fsobs.analysis.stragglers import Stragglers, find_stragglers
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
    collectives: Collectives
    """Collectives matched across ranks, clock offsets, unmatched instances."""
    bubbles: list[StepBubbles]
    """Interval sets of every bubble class per rank and step (for export and timelines)."""
    steps: pd.DataFrame
    """Per rank and step, ms: see :func:`fsobs.analysis.bubbles.bubble_table`."""
    stragglers: Stragglers
    attribution: Attribution | None
    """How much of the straggler wait the input data explains; None without step sidecars."""
    summary: dict[str, float]
    """The KPIs, see :func:`summarize`."""
    hta: HtaMetrics | None
    """None for CPU-only runs, where HTA's GPU metrics do not apply."""


def analyze(run: Run, config: BubbleConfig | None = None) -> Analysis:
    """Analyze a loaded run: collectives, bubbles per rank and step, stragglers, KPIs, HTA."""
    colls = match_collectives(run)
    bubbles = bubble_intervals(run, colls, config)
    steps = bubble_table(bubbles)
    stragglers = find_stragglers(colls, run.steps)
    has_sidecar = run.sidecar is not None and not run.sidecar.empty
    return Analysis(
        run=run,
        overview=rank_overview(run),
        collectives=colls,
        bubbles=bubbles,
        steps=steps,
        stragglers=stragglers,
        attribution=attribute(run.sidecar, stragglers, colls) if has_sidecar else None,
        summary=summarize(steps, colls),
        hta=hta_metrics(run) if run.device == "gpu" else None,
    )


def summarize(steps: pd.DataFrame, colls: Collectives) -> dict[str, float]:
    """KPIs over all ranks and steps.

    ``bubble_ratio = Σ bubble / Σ window``; ``*_ms_per_step`` are means over (rank, step);
    the step time of a step is its longest window over the ranks, and its p50/p90 are over steps.
    """
    if steps.empty:
        nan = float("nan")
        keys = (
            "bubble_ratio",
            "bubble_ms_per_step",
            "straggler_wait_ms_per_step",
            "exposed_comm_ms_per_step",
            "host_idle_ms_per_step",
            "contention_ms_per_step",
            "step_time_ms_p50",
            "step_time_ms_p90",
        )
        return dict.fromkeys(keys, nan) | {"clock_skew_ms": colls.skew_ms}
    step_time = steps.groupby("step")["window_ms"].max().to_numpy()
    return {
        "bubble_ratio": float(steps["bubble_ms"].sum() / steps["window_ms"].sum()),
        "bubble_ms_per_step": float(steps["bubble_ms"].mean()),
        "straggler_wait_ms_per_step": float(steps["straggler_wait_ms"].mean()),
        "exposed_comm_ms_per_step": float(steps["exposed_comm_ms"].mean()),
        "host_idle_ms_per_step": float(steps["host_idle_ms"].mean()),
        "other_ms_per_step": float(steps["other_ms"].mean()),
        "contention_ms_per_step": float(steps["contention_ms"].mean()),
        "step_time_ms_p50": float(np.percentile(step_time, 50)),
        "step_time_ms_p90": float(np.percentile(step_time, 90)),
        "clock_skew_ms": colls.skew_ms,
    }


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
