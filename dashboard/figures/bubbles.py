"""Figures of one run's bubbles: DataFrames in, Plotly figures out."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._style import CLASS_COLORS, finish, label
from dashboard.tables import BUBBLE_CLASSES, TIMELINE_LABELS, class_means_by_rank, wait_matrix


def bubble_classes_by_rank(steps: pd.DataFrame) -> go.Figure:
    """Stacked bars: per rank, the mean ms per step of each bubble class (``Analysis.steps``)."""
    means = class_means_by_rank(steps)
    ranks = [str(r) for r in means.index]
    fig = go.Figure(
        [
            go.Bar(
                name=label(cls),
                x=ranks,
                y=means[cls].to_numpy(),
                marker_color=CLASS_COLORS[cls],
            )
            for cls in BUBBLE_CLASSES
        ]
    )
    return finish(
        fig,
        "Bubble per rank by class (mean ms per step)",
        "rank",
        "ms per step",
        barmode="stack",
        xaxis_type="category",
    )


def straggler_wait_heatmap(steps: pd.DataFrame) -> go.Figure:
    """Heatmap of straggler wait (ms), ranks by steps."""
    matrix = wait_matrix(steps)
    fig = go.Figure(
        go.Heatmap(
            z=matrix.to_numpy(),
            x=[str(s) for s in matrix.columns],
            y=[str(r) for r in matrix.index],
            colorscale="Reds",
            colorbar={"title": {"text": "ms"}},
            hovertemplate="rank %{y}, step %{x}: %{z:.3f} ms<extra></extra>",
        )
    )
    return finish(
        fig,
        "Straggler wait per rank and step (ms)",
        "step",
        "rank",
        xaxis_type="category",
        yaxis_type="category",
    )


def step_timeline(intervals: pd.DataFrame, step: int) -> go.Figure:
    """One step across ranks: compute / comm / wait / idle / other lanes as horizontal bars.

    ``intervals``: rank, lane, start_ms, end_ms (see :func:`dashboard.tables.timeline_frame`).
    """
    traces = []
    for lane in TIMELINE_LABELS.values():
        part = intervals[intervals["lane"] == lane]
        traces.append(
            go.Bar(
                name=lane,
                orientation="h",
                y=[f"rank {r}" for r in part["rank"]],
                base=part["start_ms"].to_numpy(),
                x=(part["end_ms"] - part["start_ms"]).to_numpy(),
                marker_color=CLASS_COLORS[lane],
                hovertemplate=lane + ": %{base:.3f} + %{x:.3f} ms<extra></extra>",
            )
        )
    fig = go.Figure(traces)
    return finish(
        fig,
        f"Step {step} across ranks (ms from the first rank's start, clocks aligned)",
        "ms",
        "",
        barmode="overlay",
        yaxis={"autorange": "reversed", "type": "category"},
    )


def straggler_steps(per_step: pd.DataFrame) -> go.Figure:
    """The straggler of each step (marker size: the wait it caused) — a flat line is stable."""
    wait = per_step["wait_caused_ms"].to_numpy(dtype=float)
    size = 8 + 30 * (wait / wait.max() if len(wait) and wait.max() > 0 else np.zeros_like(wait))
    fig = go.Figure(
        go.Scatter(
            x=per_step["step"].to_numpy(),
            y=per_step["rank"].to_numpy(),
            mode="markers+lines",
            marker={"size": size, "color": CLASS_COLORS["straggler_wait"]},
            line={"width": 1, "color": "#cccccc"},
            customdata=wait,
            hovertemplate="step %{x}: rank %{y} caused %{customdata:.3f} ms<extra></extra>",
            name="straggler",
        )
    )
    return finish(fig, "Straggler rank per step (size: wait it caused)", "step", "rank")


def data_attribution(lateness: pd.DataFrame, cost_source: str) -> go.Figure:
    """Estimated cost of each rank's data against how late it arrived, one color per rank.

    ``lateness``: rank, step, cost, lateness_ms (see :func:`dashboard.tables.lateness_frame`).
    """
    fig = go.Figure(
        [
            go.Scatter(
                name=f"rank {rank}",
                x=part["cost"].to_numpy(),
                y=part["lateness_ms"].to_numpy(),
                mode="markers",
                customdata=part["step"].to_numpy(),
                hovertemplate="step %{customdata}: cost %{x:.3g}, late %{y:.3f} ms<extra></extra>",
            )
            for rank, part in lateness.groupby("rank")
        ]
    )
    return finish(
        fig,
        "Data cost against arrival at the step's collectives",
        f"estimated cost ({cost_source})",
        "arrival after the first rank (ms)",
    )


def hta_temporal_breakdown(temporal: pd.DataFrame) -> go.Figure:
    """HTA's temporal breakdown per rank (µs): compute, non-compute and idle, stacked."""
    parts = {
        "compute": ("compute_time_us", CLASS_COLORS["busy"]),
        "non-compute": ("non_compute_time_us", CLASS_COLORS["exposed_comm"]),
        "idle": ("idle_time_us", CLASS_COLORS["host_idle"]),
    }
    ranks = [str(r) for r in temporal["rank"]]
    fig = go.Figure(
        [
            go.Bar(name=name, x=ranks, y=temporal[column].to_numpy(), marker_color=color)
            for name, (column, color) in parts.items()
        ]
    )
    return finish(
        fig,
        "GPU temporal breakdown (HTA rules, µs)",
        "rank",
        "µs",
        barmode="stack",
        xaxis_type="category",
    )
