"""A run's figure is built once per signature and choice (``dashboard.cache.figure_of``): a
rerun of a page serializes the figure it built before, and any other choice builds anew."""

from __future__ import annotations

import plotly.graph_objects as go

from dashboard.cache import figure_of

SIGNATURE = (("rank0.trace.json", 1, 2),)


def test_a_figure_is_built_once_per_signature_and_choice():
    built: list[tuple[int, ...]] = []

    def build(ranks: tuple[int, ...]) -> go.Figure:
        built.append(ranks)
        return go.Figure(go.Bar(x=list(ranks), y=[1] * len(ranks)), {"title": {"text": "T"}})

    figure_of.clear()
    first = figure_of("store", "run", SIGNATURE, "bars", ((0, 1),), lambda: build((0, 1)))
    again = figure_of("store", "run", SIGNATURE, "bars", ((0, 1),), lambda: build((0, 1)))
    other = figure_of("store", "run", SIGNATURE, "bars", ((2,),), lambda: build((2,)))
    edited = (("rank0.trace.json", 1, 3),)  # the file changed: its mtime
    later = figure_of("store", "run", edited, "bars", ((0, 1),), lambda: build((0, 1)))
    assert again is first
    assert built == [(0, 1), (2,), (0, 1)]
    assert list(other.data[0].x) == [2] and later is not first
    # the title moved into the template once, in bold (dashboard.widgets.chart's rule)
    assert first.layout.title.text is None
    assert first.layout.template.layout.title.text == "<b>T</b>"
