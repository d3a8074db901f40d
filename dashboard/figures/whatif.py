"""Figures of the What-if page: predicted reductions (with measured A/Bs beside them) and the
simulated scale study."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._style import CONTROL_COLOR, TEST_COLOR, error_bars, finish

PREDICTED_COLOR = "#9467bd"


def whatif_reductions(frame: pd.DataFrame) -> go.Figure:
    """Predicted bubble reduction (%) of each toggle combination with its interval, and the
    measured reduction (with its CI) where an A/B of the run exists.

    ``frame``: ``label, predicted, lo, hi`` and optionally ``measured, measured_lo,
    measured_hi`` (NaN where none was measured), fractions.
    """
    traces = [
        go.Bar(
            x=frame["label"],
            y=100 * frame["predicted"],
            error_y=error_bars(frame["predicted"], frame["lo"], frame["hi"]),
            name="predicted (from this run)",
            marker_color=PREDICTED_COLOR,
            text=[f"{v:.0%}" for v in frame["predicted"]],
        )
    ]
    if "measured" in frame and frame["measured"].notna().any():
        traces.append(
            go.Bar(
                x=frame["label"],
                y=100 * frame["measured"],
                error_y=error_bars(frame["measured"], frame["measured_lo"], frame["measured_hi"]),
                name="measured A/B",
                marker_color=TEST_COLOR,
                text=["" if math.isnan(v) else f"{v:.0%}" for v in frame["measured"]],
            )
        )
    fig = go.Figure(traces)
    fig.update_layout(barmode="group")
    return finish(fig, "Bubble reduction, predicted and measured (%)", "", "% less bubble")


def scale_curve(curve: pd.DataFrame) -> go.Figure:
    """Simulated bubble ratio (%) against the world size (log scale), one line per job.

    ``curve``: ``job, world_size, bubble_ratio`` (means over seeds).
    """
    fig = go.Figure(
        [
            go.Scatter(
                x=rows["world_size"],
                y=100 * rows["bubble_ratio"],
                mode="lines+markers",
                name=str(job),
                line={"color": color},
            )
            for (job, rows), color in zip(
                curve.groupby("job", sort=False),
                (CONTROL_COLOR, "#ff7f0e", "#7f7f7f"),
                strict=False,
            )
        ]
    )
    fig.update_xaxes(type="log", tickvals=sorted(curve["world_size"].unique()))
    return finish(
        fig, "Bubble ratio against world size, random split (simulated)", "ranks", "% of step time"
    )


def toggles_at_scale(study: pd.DataFrame, world_size: int) -> go.Figure:
    """Simulated bubble reduction (%) of each toggle combination at one world size.

    ``study``: ``toggles, bubble_reduction, reduction_min, reduction_max`` (the baseline row is
    left out).
    """
    rows = study[study["toggles"] != "baseline"]
    fig = go.Figure(
        go.Bar(
            x=[t.replace("+", " + ") for t in rows["toggles"]],
            y=100 * rows["bubble_reduction"],
            error_y=error_bars(
                rows["bubble_reduction"], rows["reduction_min"], rows["reduction_max"]
            ),
            marker_color=PREDICTED_COLOR,
            text=[f"{v:.0%}" for v in rows["bubble_reduction"]],
            name="simulated",
        )
    )
    return finish(
        fig, f"Bubble reduction at {world_size} ranks (simulated, %)", "", "% less bubble"
    )
