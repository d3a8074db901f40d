"""Colors and layout shared by the figures."""

from __future__ import annotations

import plotly.graph_objects as go

CLASS_COLORS = {
    "busy": "#9fb8ad",
    "compute": "#9fb8ad",
    "straggler_wait": "#d62728",
    "wait": "#d62728",
    "exposed_comm": "#ff7f0e",
    "comm": "#ff7f0e",
    "host_idle": "#7f7f7f",
    "idle": "#7f7f7f",
    "other": "#9467bd",
}
CONTROL_COLOR = "#1f77b4"
TEST_COLOR = "#2ca02c"


def label(name: str) -> str:
    """``straggler_wait`` -> ``straggler wait``."""
    return name.replace("_", " ")


def finish(fig: go.Figure, title: str, x: str, y: str, **layout: object) -> go.Figure:
    """Title, axis titles and a compact margin."""
    fig.update_layout(
        title={"text": title},
        xaxis_title=x,
        yaxis_title=y,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "y": -0.2},
        **layout,
    )
    return fig
