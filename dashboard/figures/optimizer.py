"""Figures of the optimizer page: cost-model fit and balance plan."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._density import DENSITY_ABOVE, density
from dashboard.figures._style import CONTROL_COLOR, TEST_COLOR, finish
from dashboard.ranks import top_and_rest


def cost_fit(points: pd.DataFrame) -> go.Figure:
    """Measured against predicted busy ms per (rank, step), with the y = x line
    (``CostFit.points``); above :data:`~dashboard.figures._density.DENSITY_ABOVE` points,
    their density (:mod:`dashboard.figures._density`)."""
    measured = points["measured_ms"].to_numpy(dtype=float)
    predicted = points["predicted_ms"].to_numpy(dtype=float)
    top = float(max(measured.max(), predicted.max())) if len(points) else 1.0
    line = go.Scatter(
        name="measured = predicted",
        x=[0.0, top],
        y=[0.0, top],
        mode="lines",
        line={"dash": "dash", "color": "#888888"},
    )
    title = "Cost model: measured against predicted busy time"
    if len(points) > DENSITY_ABOVE:
        cells = density(
            predicted,
            measured,
            name="(rank, step) points",
            hovertemplate="predicted ~%{x:.3f} ms, measured ~%{y:.3f} ms: %{z} (rank, step) "
            "point(s)<extra></extra>",
        )
        fig = go.Figure([cells, line])
        title += f": density of the {len(points):,} (rank, step) points"
    else:
        fig = go.Figure(
            [
                go.Scatter(
                    name="(rank, step)",
                    x=predicted,
                    y=measured,
                    mode="markers",
                    customdata=points[["rank", "step"]].to_numpy(),
                    hovertemplate="rank %{customdata[0]}, step %{customdata[1]}: "
                    "predicted %{x:.3f} ms, measured %{y:.3f} ms<extra></extra>",
                ),
                line,
            ]
        )
    return finish(fig, title, "predicted ms", "measured ms")


def balance_bars(per_rank: pd.DataFrame, unit: str) -> go.Figure:
    """Per-rank cost before and after balancing, with the mean as a dotted line
    (``BalancePlan.per_rank``); ``unit``: what the cost model counts. Above
    :data:`dashboard.ranks.AGGREGATE_ABOVE` ranks: the ranks costliest before, then one bar for
    the mean of the others (:func:`dashboard.ranks.top_and_rest`); the line stays the mean of
    every rank."""
    mean = float(np.mean(per_rank["cost_before"])) if len(per_rank) else 0.0
    costs = per_rank.set_index("rank")[["cost_before", "cost_after"]]
    costs, folded = top_and_rest(costs, costs["cost_before"])
    ranks = list(costs.index)
    title = "Per-rank cost of the batch, before and after"
    if folded:
        title += (
            f": top {len(ranks) - 1} ranks by cost before, then the mean of the {folded} others"
        )
    fig = go.Figure(
        [
            go.Bar(
                name="before (job's split)",
                x=ranks,
                y=costs["cost_before"].to_numpy(),
                marker_color=CONTROL_COLOR,
            ),
            go.Bar(
                name="after (balanced)",
                x=ranks,
                y=costs["cost_after"].to_numpy(),
                marker_color=TEST_COLOR,
            ),
        ]
    )
    fig.add_hline(y=mean, line_dash="dot", annotation_text="mean")
    return finish(
        fig,
        title,
        "rank",
        f"estimated cost ({unit})",
        barmode="group",
        xaxis_type="category",
    )


def imbalance_over_steps(imbalance: pd.DataFrame) -> go.Figure:
    """The imbalance (max / mean cost) the job logged per step: random split against the split
    used (``step, imbalance_before, imbalance_after``)."""
    fig = go.Figure(
        [
            go.Scatter(
                name="random split",
                x=imbalance["step"].to_numpy(),
                y=imbalance["imbalance_before"].to_numpy(),
                mode="lines+markers",
                marker_color=CONTROL_COLOR,
            ),
            go.Scatter(
                name="split used",
                x=imbalance["step"].to_numpy(),
                y=imbalance["imbalance_after"].to_numpy(),
                mode="lines+markers",
                marker_color=TEST_COLOR,
            ),
        ]
    )
    return finish(fig, "Imbalance per step (max / mean rank cost)", "step", "imbalance")
