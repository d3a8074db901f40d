"""Figures of one run's bubbles: DataFrames in, Plotly figures out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._density import DENSITY_ABOVE, density
from dashboard.figures._style import CLASS_COLORS, finish, label
from dashboard.numbers import HOVER_NUMBER, cost_unit
from dashboard.ranks import AGGREGATE_ABOVE, top_and_rest
from dashboard.tables import TIMELINE_CLASSES, class_means_by_rank, wait_matrix
from fsobs.analysis import BUBBLE_CLASSES


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
    says how many of the run's ranks are shown). The scale starts at 0 ms (white), so a run
    without wait looks like one (and its title says so)."""
    matrix = wait_matrix(steps)
    title = "Straggler wait per rank and step (ms)"
    if ranks is not None:
        total = len(matrix)
        matrix = matrix.loc[matrix.index.isin(list(ranks))]
        if len(matrix) < total:
            title += f": {len(matrix)} of {total} ranks"
    z = matrix.to_numpy(dtype=float)
    top = float(np.nanmax(z)) if z.size and not np.isnan(z).all() else 0.0
    if top <= 0:
        title += ": no rank waited"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[str(s) for s in matrix.columns],
            y=[str(r) for r in matrix.index],
            colorscale="Reds",
            zmin=0.0,
            zmax=top if top > 0 else 1.0,  # all zero: the colour of zero, not mid-scale
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
    bars: pd.DataFrame,
    steps: Sequence[int],
    *,
    num_ranks: int | None = None,
    names: Sequence[str] | None = None,
    places: dict[tuple[int, str], str] | None = None,
    path: pd.DataFrame | None = None,
) -> go.Figure:
    """The chosen steps across ranks: per rank, one lane per class in the legend's order
    (:data:`dashboard.tables.TIMELINE_CLASSES`), horizontal bars; a merged bar is as opaque as
    its class fills it (at least 0.3). Lanes empty on every rank are left out.

    ``bars``: rank, lane (the class), start_ms, end_ms, class_ms, intervals (see
    :func:`dashboard.tables.timeline_frame`). Row ``i * len(lanes) + j`` is lane ``j`` of the
    ``i``-th rank; the left axis names the ranks, a label right of each lane names its class
    and, with ``places``, where its ops ran (``stream 7`` / ``thread 12``); the hover names
    rank, class and, with ``names`` (one text per bar, :func:`dashboard.ops.bar_names`), the
    ops or kernels inside the bar. ``num_ranks``: the run's ranks, when ``bars`` holds only
    some of them (the title says how many are shown). ``path``: the critical path of the steps
    (:func:`dashboard.tables.path_frame`), drawn over the lanes (:func:`_path_line`).
    """
    ranks = sorted(int(r) for r in bars["rank"].unique())
    lanes = [lane for lane in TIMELINE_CLASSES if lane in set(bars["lane"])]
    group = {rank: number * len(lanes) for number, rank in enumerate(ranks)}
    text = pd.Series(list(names) if names is not None else [""] * len(bars), index=bars.index)
    traces = [
        _timeline_lane(bars[bars["lane"] == lane], lane, offset, group, text, names is not None)
        for offset, lane in enumerate(lanes)
    ]
    if path is not None and len(path):
        traces.append(_path_line(path, group, (len(lanes) - 1) / 2))
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
        margin={"l": 70, "r": LANE_LABEL_PX, "t": 80, "b": 50},
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
        annotations=[
            {
                "xref": "paper",
                "x": 1.0,
                "xanchor": "left",
                "yref": "y",
                "y": start + offset,
                "text": _lane_text(rank, lane, places),
                "showarrow": False,
                "font": {"size": 10, "color": "#555555"},
            }
            for rank, start in group.items()
            for offset, lane in enumerate(lanes)
        ],
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


LANE_LABEL_PX = 210
"""Right margin of the timeline, where each lane's label goes."""


def _lane_text(rank: int, lane: str, places: dict[tuple[int, str], str] | None) -> str:
    where = (places or {}).get((rank, lane))
    return f"{label(lane)} · {where}" if where else label(lane)


def _timeline_lane(
    part: pd.DataFrame,
    lane: str,
    offset: int,
    group: dict[int, int],
    text: pd.Series,
    named: bool,
) -> go.Bar:
    """The bars of one class over every rank (see :func:`step_timeline`)."""
    name = label(lane)
    width = (part["end_ms"] - part["start_ms"]).to_numpy(dtype=float)
    covered = part["class_ms"].to_numpy(dtype=float)
    fill = np.divide(covered, width, out=np.ones_like(width), where=width > 0)
    ops = "<br>%{hovertext}" if named else ""
    return go.Bar(
        name=name,
        orientation="h",
        y=[group[int(r)] + offset for r in part["rank"]],
        base=part["start_ms"].to_numpy(dtype=float),
        x=width,
        width=0.8,
        marker={"color": CLASS_COLORS[lane], "opacity": 0.3 + 0.7 * np.clip(fill, 0, 1)},
        customdata=np.column_stack(
            [part["rank"].to_numpy(dtype=float), covered, part["intervals"], 100 * fill]
        ),
        hovertext=[t or "no op or kernel of this class inside" for t in text[part.index]]
        if named
        else None,
        hovertemplate=f"rank %{{customdata[0]}} · {name}: from %{{base:.3f}} ms, "
        "%{x:.3f} ms long<br>"
        f"{name} %{{customdata[1]:.3f}} ms (%{{customdata[3]:.0f}}% of the bar) "
        f"in %{{customdata[2]}} interval(s){ops}<extra></extra>",
    )


PATH_COLOR = "#111111"


def _path_line(path: pd.DataFrame, group: dict[int, int], middle: float) -> go.Scatter:
    """The critical path as one line: along the middle of a rank's lanes for each segment,
    vertical where it jumps to another rank; broken between steps and where it runs on a rank
    that is not drawn::

        rank 0   ----------+           +------      segment on rank 0, jump, ...
        rank 1             +-----------+
    """
    x: list[float | None] = []
    y: list[float | None] = []
    text: list[str | None] = []
    prev_step = None
    for step, rank, kind, name, lo, hi in path[
        ["step", "rank", "kind", "name", "start_ms", "end_ms"]
    ].itertuples(index=False):
        if int(rank) not in group or (prev_step is not None and step != prev_step):
            x.append(None)  # a break in the line
            y.append(None)
            text.append(None)
        prev_step = step
        if int(rank) not in group:
            continue
        row = group[int(rank)] + middle
        what = f"step {step} · rank {rank} · {kind} {name}".rstrip()
        x += [float(lo), float(hi)]
        y += [row, row]
        text += [what, what]
    return go.Scatter(
        name="critical path",
        x=x,
        y=y,
        mode="lines",
        line={"color": PATH_COLOR, "width": 2},
        hovertext=text,
        hovertemplate="%{hovertext}: %{x:.3f} ms<extra>critical path</extra>",
    )


def classes_over_steps(steps: pd.DataFrame, ranks: Sequence[int] | None = None) -> go.Figure:
    """Stacked bars per step: the mean ms per rank of busy time and of each bubble class, so a
    bar is the step's mean window (``Analysis.steps``; only ``ranks`` if given)."""
    chosen = steps if ranks is None else steps[steps["rank"].isin(list(ranks))]
    classes = ["busy", *BUBBLE_CLASSES]
    means = chosen.groupby("step")[[f"{c}_ms" for c in classes]].mean()
    fig = go.Figure(
        [
            go.Bar(
                name=label(cls),
                x=[str(s) for s in means.index],
                y=means[f"{cls}_ms"].to_numpy(),
                marker_color=CLASS_COLORS[cls],
                hovertemplate=f"step %{{x}}: {label(cls)} %{{y:.3f}} ms per rank<extra></extra>",
            )
            for cls in classes
        ]
    )
    some = "" if ranks is None else f", {chosen['rank'].nunique()} ranks"
    return finish(
        fig,
        f"Step time by class, step by step (mean ms per rank{some})",
        "step",
        "ms per rank",
        margin={"l": 70, "r": 20, "t": 60, "b": 110},
        legend={"orientation": "h", "y": -0.3},
        barmode="stack",
        xaxis_type="category",
    )


TICK_PER_RANK_SPAN = 32
"""The stragglers' chart labels every rank when its ranks span at most this many (else Plotly
picks the ticks: 256 labels are slow to draw and unreadable)."""


def straggler_steps(per_step: pd.DataFrame) -> go.Figure:
    """The straggler of each step (marker size: the wait it caused) — a flat line is stable.
    A tick per rank over a span of at most :data:`TICK_PER_RANK_SPAN` ranks."""
    wait = per_step["wait_caused_ms"].to_numpy(dtype=float)
    ranks = per_step["rank"].to_numpy(dtype=float)
    span = float(ranks.max() - ranks.min()) + 1 if len(ranks) else 0.0
    yaxis: dict[str, object] = {"tickformat": "d"}
    if span <= TICK_PER_RANK_SPAN:
        yaxis |= {"tickmode": "linear", "dtick": 1}
    size = 8 + 30 * (wait / wait.max() if len(wait) and wait.max() > 0 else np.zeros_like(wait))
    fig = go.Figure(
        go.Scatter(
            x=per_step["step"].to_numpy(),
            y=per_step["rank"].to_numpy(),
            mode="markers+lines",
            marker={"size": size, "color": CLASS_COLORS["straggler_wait"]},
            line={"width": 1, "color": "#cccccc"},
            customdata=wait,
            hovertemplate="step %{x}: rank %{y} caused %{customdata:.3f} ms of wait<extra></extra>",
            name="straggler",
        )
    )
    return finish(
        fig,
        "Straggler rank per step (size: wait it caused)",
        "step",
        "rank",
        yaxis=yaxis,
        xaxis={"tickformat": "d"},
    )


def data_attribution(lateness: pd.DataFrame, cost_source: str) -> go.Figure:
    """Estimated cost of each rank's data against how late it arrived.

    ``lateness``: rank, step, cost, lateness_ms (see :func:`dashboard.tables.lateness_frame`).
    One color per rank up to :data:`dashboard.ranks.AGGREGATE_ABOVE` ranks; above, one trace
    colored by rank (a legend entry per rank would fill the screen), or, with more than
    :data:`~dashboard.figures._density.DENSITY_ABOVE` points, their density
    (:mod:`dashboard.figures._density`).
    """
    unit = cost_unit(cost_source)
    many = lateness["rank"].nunique() > AGGREGATE_ABOVE
    dense = many and len(lateness) > DENSITY_ABOVE
    if dense:
        fig = go.Figure(
            density(
                lateness["cost"].to_numpy(),
                lateness["lateness_ms"].to_numpy(),
                name="(rank, step) points",
                hovertemplate=f"cost ~%{{x:{HOVER_NUMBER}}} ({unit}), late ~%{{y:.3f}} ms: "
                "%{z} (rank, step) point(s)<extra></extra>",
            )
        )
    elif many:
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
                hovertemplate="rank %{customdata[0]}, step %{customdata[1]}: "
                f"cost %{{x:{HOVER_NUMBER}}} ({unit}), late %{{y:.3f}} ms<extra></extra>",
            )
        )
    else:
        fig = _attribution_by_rank(lateness, unit)
    title = "Data cost against arrival at the step's collectives"
    if dense:
        title += f": density of the {len(lateness):,} (rank, step) points"
    return finish(
        fig,
        title,
        f"estimated cost of the rank's data ({cost_source}: {unit})",
        "arrival after the first rank (ms)",
    )


def _attribution_by_rank(lateness: pd.DataFrame, unit: str) -> go.Figure:
    return go.Figure(
        [
            go.Scatter(
                name=f"rank {rank}",
                x=part["cost"].to_numpy(),
                y=part["lateness_ms"].to_numpy(),
                mode="markers",
                customdata=part["step"].to_numpy(),
                hovertemplate=f"step %{{customdata}}: cost %{{x:{HOVER_NUMBER}}} ({unit}), "
                "late %{y:.3f} ms<extra></extra>",
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


def all_to_all_matrix(
    ranks: Sequence[int], matrix: np.ndarray, instance: int, step: int
) -> go.Figure:
    """One all_to_all(v) instance: MB each rank (row) sent to each rank (column), from the
    split sizes (:attr:`fsobs.analysis.collectives.alltoall.AllToAll.matrices`); the scale starts
    at 0."""
    mb = np.asarray(matrix, dtype=float) / 1e6
    top = float(np.nanmax(mb)) if mb.size else 0.0
    fig = go.Figure(
        go.Heatmap(
            z=mb,
            x=[str(r) for r in ranks],
            y=[str(r) for r in ranks],
            colorscale="Blues",
            zmin=0.0,
            zmax=top if top > 0 else 1.0,
            colorbar={"title": {"text": "MB"}},
            hovertemplate="rank %{y} sent %{z:.3f} MB to rank %{x}<extra></extra>",
        )
    )
    return finish(
        fig,
        f"all_to_all(v) instance {instance} (step {step}): MB sent, rank to rank",
        "to rank",
        "from rank",
        margin={"l": 70, "r": 100, "t": 60, "b": 60},
        xaxis_type="category",
        yaxis={"type": "category", "autorange": "reversed"},
    )
