"""The figure of several arms against one control (:func:`dashboard.arms.arms_frame`)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._style import TEST_COLOR, error_bars, finish
from dashboard.text import plot_text


def arm_reductions(frame: pd.DataFrame) -> go.Figure:
    """Bubble reduction in % of each test arm against the control, with its interval."""
    tests = frame[frame["role"] == "test"]
    values = [float(v) for v in tests["reduction"]]
    y = [0.0 if math.isnan(v) else 100 * v for v in values]
    fig = go.Figure(
        go.Bar(
            x=[plot_text(arm) for arm in tests["arm"]],
            y=y,
            error_y=error_bars(values, tests["ci_lo"], tests["ci_hi"]),
            text=[f"{v:.0%}" if not math.isnan(v) else "n/a" for v in values],
            marker_color=[TEST_COLOR if v >= 0 else "#d62728" for v in y],
            name="reduction",
        )
    )
    control = frame.loc[frame["role"] == "control", "arm"].iloc[0]
    title = f"Bubble reduction of each arm against {plot_text(control)} (%)"
    return finish(fig, title, "", "% less bubble")
