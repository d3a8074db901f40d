"""Colors and layout shared by the figures."""

from __future__ import annotations

import math
from collections.abc import Iterable

import plotly.graph_objects as go

CLASS_COLORS = {
    "busy": "#9fb8ad",
    "straggler_wait": "#d62728",
    "exposed_comm": "#ff7f0e",
    "unattributed_comm": "#bcbd22",
    "host_idle": "#7f7f7f",
    "other": "#9467bd",
}
CONTROL_COLOR = "#1f77b4"
TEST_COLOR = "#2ca02c"


def label(name: str) -> str:
    """A class by its one name on screen: ``straggler_wait`` -> ``straggler wait``."""
    return name.replace("_", " ")


def finish(
    fig: go.Figure,
    title: str,
    x: str,
    y: str,
    *,
    margin: dict[str, int] | None = None,
    **layout: object,
) -> go.Figure:
    """Title, axis titles, a compact margin, and numbers without SI suffixes (Plotly's
    ``3.5B`` for 3.5e9 reads as bytes: large ticks are written as powers of ten, grouped).

    ``margin``: fixed margins (px) for a chart whose labels are known to fit, with Plotly's
    automatic margins off: Streamlit's theme turns ``automargin`` on, and Plotly then lays
    the chart out twice (measured in Chromium on the step timeline of an 8-rank run: 200 ms
    instead of 116 ms to draw).
    """
    defaults: dict[str, object] = {"legend": {"orientation": "h", "y": -0.2}}
    fig.update_layout(
        title={"text": title},
        xaxis_title=x,
        yaxis_title=y,
        margin=margin or {"l": 60, "r": 20, "t": 60, "b": 50},
        **(defaults | layout),
    )
    fig.update_xaxes(exponentformat="power", separatethousands=True)
    fig.update_yaxes(exponentformat="power", separatethousands=True)
    if margin is not None:
        fig.update_xaxes(automargin=False)
        fig.update_yaxes(automargin=False)
    return fig


def error_bars(
    values: Iterable[float], lo: Iterable[float], hi: Iterable[float]
) -> dict[str, object]:
    """Asymmetric error bars (in %) from fractions and their interval; a side whose bound or
    value is NaN gets none."""
    up, down = [], []
    for v, low, high in zip(values, lo, hi, strict=True):
        up.append(0.0 if math.isnan(high) or math.isnan(v) else 100 * (high - v))
        down.append(0.0 if math.isnan(low) or math.isnan(v) else 100 * (v - low))
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "visible": True}


def title_in_template(fig: go.Figure) -> go.Figure:
    """Move the title into the figure's own template, in bold: ``layout.title`` is left unset.

    Streamlit's theme wraps ``layout.title.text`` in ``<b>...</b>`` in the browser, once when a
    chart mounts and again in an effect right after, so every title arrived as
    ``<b><b>...</b></b>``. It leaves a title that comes from the template alone, and Plotly
    draws that one the same way. Changes ``fig`` (a figure made for this one chart).
    """
    text = fig.layout.title.text
    if text:
        fig.layout.title = None
        fig.layout.template.layout.title.text = f"<b>{text}</b>"
    return fig
