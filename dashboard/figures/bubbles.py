"""Figures of one run's bubbles: DataFrames in, Plotly figures out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._style import CLASS_COLORS, finish, label
from dashboard.ranks import AGGREGATE_ABOVE, top_and_rest
from dashboard.tables import BUBBLE_CLASSES, TIMELINE_LABELS, class_means_by_rank, wait_matrix


def bubble_classes_by_rank(steps: pd.DataFrame) -> go.Figure:
    """Stacked bars: per rank, the mean ms per step of each bubble class (``Analysis.steps``).

    Above :data:`dashboard.ranks.AGGREGATE_ABOVE` ranks: the ranks with the most bubble per
    step, then one bar for the mean of the others (:func:`dashboard.ranks.top_and_rest`)."""
    means = class_means_by_rank(steps)
    means, folded = top_and_rest(means, means.sum(axis=1))
    ranks = list(means.index)
    title = "Bubble per rank by class (mean ms per step)"
    if folded:
        title += f": top {len(ranks) - 1} ranks by bubble, then the mean of the {folded} others"
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
        title,
        "rank",
        "ms per step",
        margin={"l": 70, "r": 20, "t": 60, "b": 110},
        legend={"orientation": "h", "y": -0.3},
        barmode="stack",
        xaxis_type="category",
    )


def straggler_wait_heatmap(steps: pd.DataFrame, ranks: Sequence[int] | None = None) -> go.Figure:
    """Heatmap of straggler wait (ms), ranks by steps; only ``ranks`` if given (the title then
    says how many of the run's ranks are shown)."""
    matrix = wait_matrix(steps)
    title = "Straggler wait per rank and step (ms)"
    if ranks is not None:
        total = len(matrix)
        matrix = matrix.loc[matrix.index.isin(list(ranks))]
        if len(matrix) < total:
            title += f": {len(matrix)} of {total} ranks"
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
        title,
        "step",
        "rank",
        margin={"l": 70, "r": 100, "t": 60, "b": 60},
        xaxis_type="category",
        yaxis_type="category",
    )


def step_timeline(
    bars: pd.DataFrame, steps: Sequence[int], *, num_ranks: int | None = None
) -> go.Figure:
    """The chosen steps across ranks: per rank, one lane per class in the legend's order
    (compute / comm / wait / idle / other), horizontal bars; a merged bar is as opaque as its
    class fills it (at least 0.3). Lanes empty on every rank are left out.

    ``bars``: rank, lane, start_ms, end_ms, class_ms, intervals (see
    :func:`dashboard.tables.timeline_frame`). Row ``i * len(lanes) + j`` is lane ``j`` of the
    ``i``-th rank; the axis names the ranks, the hover names rank and lane. ``num_ranks``: the
    run's ranks, when ``bars`` holds only some of them (the title says how many are shown).
    """
    ranks = sorted(int(r) for r in bars["rank"].unique())
    lanes = [lane for lane in TIMELINE_LABELS.values() if lane in set(bars["lane"])]
    group = {rank: number * len(lanes) for number, rank in enumerate(ranks)}
    traces = []
    for offset, lane in enumerate(lanes):
        part = bars[bars["lane"] == lane]
        width = (part["end_ms"] - part["start_ms"]).to_numpy(dtype=float)
        covered = part["class_ms"].to_numpy(dtype=float)
        fill = np.divide(covered, width, out=np.ones_like(width), where=width > 0)
        traces.append(
            go.Bar(
                name=lane,
                orientation="h",
                y=[group[int(r)] + offset for r in part["rank"]],
                base=part["start_ms"].to_numpy(dtype=float),
                x=width,
                width=0.8,
                marker={"color": CLASS_COLORS[lane], "opacity": 0.3 + 0.7 * np.clip(fill, 0, 1)},
                customdata=np.column_stack(
                    [part["rank"].to_numpy(dtype=float), covered, part["intervals"], 100 * fill]
                ),
                hovertemplate=f"rank %{{customdata[0]}}, {lane}: from %{{base:.3f}} ms, "
                "%{x:.3f} ms long<br>"
                f"{lane} %{{customdata[1]:.3f}} ms (%{{customdata[3]:.0f}}%) "
                "in %{customdata[2]} interval(s)<extra></extra>",
            )
        )
    fig = go.Figure(traces)
    first, last = min(steps), max(steps)
    which = f"Step {first}" if first == last else f"Steps {first}–{last}"
    some = f"{len(ranks)} of {num_ranks} " if num_ranks and len(ranks) < num_ranks else ""
    rows = len(ranks) * len(lanes)
    return finish(
        fig,
        f"{which} across {some}ranks (ms from the first rank's start, clocks aligned)",
        "ms",
        "",
        margin={"l": 70, "r": 20, "t": 80, "b": 50},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1, "yanchor": "bottom"},
        barmode="overlay",
        height=130 + 14 * rows,
        yaxis={
            "autorange": "reversed",
            "tickmode": "array",
            "tickvals": [start + (len(lanes) - 1) / 2 for start in group.values()],
            "ticktext": [f"rank {rank}" for rank in group],
            "showgrid": False,
            "zeroline": False,
        },
        shapes=[
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": start - 0.5,
                "y1": start - 0.5,
                "line": {"width": 1, "color": "#bbbbbb"},
                "layer": "below",
            }
            for start in list(group.values())[1:]
        ],
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
    Above :data:`dashboard.ranks.AGGREGATE_ABOVE` ranks one trace, colored by rank (a legend
    entry per rank would fill the screen).
    """
    if lateness["rank"].nunique() > AGGREGATE_ABOVE:
        fig = go.Figure(
            go.Scatter(
                name="rank, step",
                x=lateness["cost"].to_numpy(),
                y=lateness["lateness_ms"].to_numpy(),
                mode="markers",
                marker={
                    "color": lateness["rank"].to_numpy(),
                    "colorscale": "Viridis",
                    "colorbar": {"title": {"text": "rank"}},
                    "size": 6,
                },
                customdata=lateness[["rank", "step"]].to_numpy(),
                hovertemplate="rank %{customdata[0]}, step %{customdata[1]}: cost %{x:.3g}, "
                "late %{y:.3f} ms<extra></extra>",
            )
        )
    else:
        fig = _attribution_by_rank(lateness)
    return finish(
        fig,
        "Data cost against arrival at the step's collectives",
        f"estimated cost ({cost_source})",
        "arrival after the first rank (ms)",
    )


def _attribution_by_rank(lateness: pd.DataFrame) -> go.Figure:
    return go.Figure(
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


def hta_temporal_breakdown(temporal: pd.DataFrame) -> go.Figure:
    """HTA's temporal breakdown per rank (µs): compute, non-compute and idle, stacked. Above
    :data:`dashboard.ranks.AGGREGATE_ABOVE` ranks: the ranks with the most idle time, then the
    mean of the others."""
    parts = {
        "compute": ("compute_time_us", CLASS_COLORS["busy"]),
        "non-compute": ("non_compute_time_us", CLASS_COLORS["exposed_comm"]),
        "idle": ("idle_time_us", CLASS_COLORS["host_idle"]),
    }
    columns = [column for column, _ in parts.values()]
    values = temporal.set_index("rank")[columns]
    shown, folded = top_and_rest(values, values["idle_time_us"])
    ranks = list(shown.index)
    fig = go.Figure(
        [
            go.Bar(name=name, x=ranks, y=shown[column].to_numpy(), marker_color=color)
            for name, (column, color) in parts.items()
        ]
    )
    title = "GPU temporal breakdown (HTA rules, µs)"
    if folded:
        title += f": top {len(ranks) - 1} ranks by idle, then the mean of the {folded} others"
    return finish(
        fig,
        title,
        "rank",
        "µs",
        barmode="stack",
        xaxis_type="category",
    )
