"""Figures of the Live page: a run's trend over its life, every x axis in steps.

The imbalance per step is :func:`dashboard.figures.optimizer.imbalance_over_steps` (the trend's
``step, imbalance_before, imbalance_after`` columns are its input).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._style import CLASS_COLORS, CONTROL_COLOR, TEST_COLOR, finish, label

STATE_MARKERS = {
    "pending": ("#7f7f7f", "circle-open", "pending (some rank has not published it)"),
    "missing": ("#d62728", "x", "missing (some rank never published it)"),
    "bad": ("#9467bd", "diamond-open", "bad (published, not analyzable)"),
}
"""Window state -> (color, marker symbol, legend name) for windows without a summary."""


WEBGL_ABOVE = 1000
"""A step-time trend with more steps is drawn with WebGL (Plotly Express's
``render_mode="auto"`` rule)."""


def step_time_trend(trend: pd.DataFrame, windows: pd.DataFrame) -> go.Figure:
    """Step time of every step read (``LiveRun.trend()``: ``step``, ``step_ms``; a reader
    starts near the sidecars' ends), and each closed window's mean step time at its first step
    (``dashboard.live.windows_frame``), which covers the run's whole life; WebGL above
    :data:`WEBGL_ABOVE` steps."""
    scatter = go.Scattergl if len(trend) > WEBGL_ABOVE else go.Scatter
    closed = windows[windows["state"] == "closed"]
    fig = go.Figure(
        [
            scatter(
                name="each step read",
                x=trend["step"].to_numpy(),
                y=trend["step_ms"].to_numpy(dtype=float),
                mode="lines+markers",
                marker={"color": CONTROL_COLOR, "size": 4},
                hovertemplate="step %{x}: %{y:.2f} ms<extra></extra>",
            ),
            go.Scatter(
                name="window mean",
                x=closed["first step"].to_numpy(),
                y=closed["step ms"].to_numpy(dtype=float),
                customdata=closed[["window"]].to_numpy(),
                mode="markers",
                marker={"color": TEST_COLOR, "size": 9, "symbol": "diamond"},
                hovertemplate="%{customdata[0]}: %{y:.2f} ms per step<extra></extra>",
            ),
        ]
    )
    read = (
        "no step read yet"
        if trend.empty
        else f"steps {trend['step'].min():,}-{trend['step'].max():,} read"
    )
    return finish(fig, f"Step time ({read})", "step", "ms")


def bubble_ratio_by_window(windows: pd.DataFrame) -> go.Figure:
    """Bubble ratio (%) of each closed window at its first step, and the other windows as
    markers on the step axis, one trace per state (:data:`STATE_MARKERS`), so a gap in the
    line is named (``dashboard.live.windows_frame``)."""
    closed = windows[windows["state"] == "closed"]
    traces = [
        go.Scatter(
            name="closed window",
            x=closed["first step"].to_numpy(),
            y=100 * closed["bubble ratio"].to_numpy(dtype=float),
            customdata=closed[["window", "last step"]].to_numpy(),
            mode="lines+markers",
            marker={"color": CLASS_COLORS["straggler_wait"]},
            hovertemplate="%{customdata[0]} (steps %{x}-%{customdata[1]}): "
            "%{y:.1f}% bubble<extra></extra>",
        )
    ]
    for state, (color, symbol, name) in STATE_MARKERS.items():
        rows = windows[windows["state"] == state]
        if rows.empty:
            continue
        traces.append(
            go.Scatter(
                name=name,
                x=rows["first step"].to_numpy(),
                y=[0.0] * len(rows),
                customdata=rows[["window", "last step"]].to_numpy(),
                mode="markers",
                marker={"color": color, "symbol": symbol, "size": 11},
                hovertemplate=f"%{{customdata[0]}} (steps %{{x}}-%{{customdata[1]}}): {state}"
                "<extra></extra>",
            )
        )
    title = f"Bubble ratio per window ({len(closed)} of {len(windows)} closed)"
    return finish(go.Figure(traces), title, "first step of the window", "bubble ratio (%)")


def classes_by_window(classes: pd.DataFrame) -> go.Figure:
    """Stacked bars of bubble class ms per rank and step, one bar per closed window spanning
    its steps (``dashboard.live.classes_frame``)."""
    traces = []
    for name, rows in classes.groupby("class", sort=False):
        width = (rows["last_step"] - rows["first_step"] + 1).to_numpy()
        traces.append(
            go.Bar(
                name=label(str(name)),
                x=rows["first_step"].to_numpy(),
                y=rows["ms_per_step"].to_numpy(dtype=float),
                width=width,
                offset=0,
                customdata=rows[["window"]].to_numpy(),
                marker_color=CLASS_COLORS.get(str(name), "#17becf"),
                hovertemplate=f"%{{customdata[0]}}: {label(str(name))} %{{y:.3f}} ms"
                "<extra></extra>",
            )
        )
    return finish(
        go.Figure(traces),
        f"Bubble classes per window ({classes['window'].nunique()} closed)",
        "step",
        "ms per rank and step",
        barmode="stack",
    )
