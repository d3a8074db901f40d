"""Many points drawn as their density: a heatmap counted here, which the browser draws at once.

Above :data:`DENSITY_ABOVE` points a scatter of one point per (rank, step) costs the browser
more than the rest of its page: 256 ranks x 20 steps (5,120 points) took about 1.5 s on every
visit, in WebGL too (headless and software-rendered browsers draw WebGL on the CPU). Nobody reads
5,120 points one by one; their density, one cell per bin of x and y, shows the same shape.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

DENSITY_ABOVE = 1000
"""Scatters with more points are drawn as their density."""
DENSITY_BINS = (40, 30)
"""Bins of x and of y."""


def density(x: np.ndarray, y: np.ndarray, *, name: str, hovertemplate: str) -> go.Heatmap:
    """How many points fall in each of :data:`DENSITY_BINS` cells (empty cells blank): the
    heatmap's ``x`` and ``y`` are the cells' centres, its ``z`` rows the y bins."""
    counts, x_edges, y_edges = np.histogram2d(
        np.asarray(x, dtype=float), np.asarray(y, dtype=float), bins=DENSITY_BINS
    )
    return go.Heatmap(
        name=name,
        x=(x_edges[:-1] + x_edges[1:]) / 2,
        y=(y_edges[:-1] + y_edges[1:]) / 2,
        z=np.where(counts > 0, counts, np.nan).T,
        colorscale="Viridis",
        colorbar={"title": {"text": "points"}},
        hovertemplate=hovertemplate,
    )
