"""Figures of a control / test comparison (:class:`fsobs.analysis.comparison.ab.Comparison`
parts)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures._style import (
    CLASS_COLORS,
    CONTROL_COLOR,
    TEST_COLOR,
    error_bars,
    finish,
    label,
)
from fsobs.analysis import BUBBLE_CLASSES


def bubble_reduction(
    overall: float,
    ci: tuple[float, float],
    by_class: dict[str, float],
    by_class_ci: dict[str, tuple[float, float]],
) -> go.Figure:
    """Bubble reduction in % overall and per class, each with its confidence interval.

    A class the control does not have (NaN reduction) is drawn as 0 and named in the hover.
    """
    names = ["bubble", *by_class]
    values = [overall, *by_class.values()]
    intervals = [ci, *(by_class_ci[n] for n in by_class)]
    y = [100 * v if not math.isnan(v) else 0.0 for v in values]
    error = error_bars(values, (lo for lo, _ in intervals), (hi for _, hi in intervals))
    text = [f"{v:.0%}" if not math.isnan(v) else "n/a (not in control)" for v in values]
    fig = go.Figure(
        go.Bar(
            x=[label(n) for n in names],
            y=y,
            error_y=error,
            text=text,
            marker_color=[TEST_COLOR if v >= 0 else "#d62728" for v in y],
            name="reduction",
        )
    )
    return finish(fig, "Bubble reduction of test against control (%)", "", "% less bubble")


def class_means(control: pd.DataFrame, test: pd.DataFrame) -> go.Figure:
    """Grouped bars: mean ms per step of each bubble class, control against test
    (``Analysis.steps`` of each run)."""
    fig = go.Figure(
        [
            go.Bar(
                name=role,
                x=[label(c) for c in BUBBLE_CLASSES],
                y=[float(steps[f"{c}_ms"].mean()) for c in BUBBLE_CLASSES],
                marker_color=color,
            )
            for role, steps, color in (
                ("control", control, CONTROL_COLOR),
                ("test", test, TEST_COLOR),
            )
        ]
    )
    return finish(fig, "Bubble classes (mean ms per rank and step)", "", "ms", barmode="group")


def per_rank_delta(per_rank: pd.DataFrame) -> go.Figure:
    """Per rank, the change of each bubble class (test - control, ms per step), stacked
    (``Comparison.per_rank``)."""
    ranks = [str(r) for r in per_rank["rank"]]
    fig = go.Figure(
        [
            go.Bar(
                name=label(c),
                x=ranks,
                y=per_rank[f"{c}_ms_delta"].to_numpy(),
                marker_color=CLASS_COLORS[c],
            )
            for c in BUBBLE_CLASSES
        ]
    )
    return finish(
        fig,
        "Change per rank, test - control (ms per step; below 0 is better)",
        "rank",
        "ms per step",
        barmode="relative",
        xaxis_type="category",
    )


def step_time_distribution(step_times: pd.DataFrame) -> go.Figure:
    """Box plots of the step time (ms) of each run, every step shown
    (``Comparison.step_times``: run, step, step_time_ms)."""
    colors = {"control": CONTROL_COLOR, "test": TEST_COLOR}
    fig = go.Figure(
        [
            go.Box(
                name=role,
                y=part["step_time_ms"].to_numpy(),
                boxpoints="all",
                marker_color=colors.get(str(role)),
            )
            for role, part in step_times.groupby("run", sort=False)
        ]
    )
    return finish(fig, "Step time distribution (ms)", "", "step time (ms)")


def op_diff_top(table: pd.DataFrame, top: int = 15) -> go.Figure:
    """The ``top`` ops with the largest absolute duration change (µs, test - control)."""
    biggest = table.reindex(table["diff_duration"].abs().sort_values(ascending=False).index)
    biggest = biggest.head(top).iloc[::-1]
    fig = go.Figure(
        go.Bar(
            orientation="h",
            x=biggest["diff_duration"].to_numpy(),
            y=[str(n)[:60] for n in biggest.index],
            marker_color=["#d62728" if v > 0 else TEST_COLOR for v in biggest["diff_duration"]],
            name="duration change",
        )
    )
    return finish(fig, f"Largest op duration changes (top {top}, µs)", "µs, test - control", "")
