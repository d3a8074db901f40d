"""The critical path drawn on the step timeline, on the two-rank run of
:func:`tests.test_critical_path.two_rank_docs` (path by hand there: rank 1's fwd [10, 60) µs,
rank 0's all_reduce [60, 80), rank 0's bwd [80, 100); the timeline's 0 is the earliest window
start, 10 µs)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import pytest

from dashboard import figures
from dashboard.tables import path_frame, timeline_frame
from fsobs.analysis import Analysis, analyze
from tests.support.bubble_rows import load_docs
from tests.unit.analysis.test_critical_path import two_rank_docs


@pytest.fixture
def analysis(tmp_path: Path) -> Analysis:
    return analyze(load_docs(tmp_path, two_rank_docs()))


def _figure(analysis: Analysis, ranks: list[int]) -> go.Figure:
    bars = timeline_frame(analysis.bubbles.of_ranks(ranks), [1], analysis.collectives.offsets_ns)
    path = path_frame(analysis.critical_path.segments, [1], bars.attrs["origin_ns"])
    return figures.step_timeline(bars, [1], path=path)


def test_the_path_runs_along_each_rank_s_lanes_and_jumps_at_the_collective(
    analysis: Analysis,
) -> None:
    fig = _figure(analysis, [0, 1])
    line = fig.data[-1]
    assert line.name == "critical path"
    lanes = len(fig.data) - 1
    middle = (lanes - 1) / 2  # the middle of a rank's lanes; rank 1's start at row `lanes`
    assert list(line.x) == pytest.approx([0.0, 0.05, 0.05, 0.07, 0.07, 0.09])
    assert list(line.y) == [lanes + middle] * 2 + [middle] * 4
    assert line.hovertext[0] == "step 1 · rank 1 · kernel fwd"


def test_a_segment_on_a_rank_not_drawn_breaks_the_line(analysis: Analysis) -> None:
    fig = _figure(analysis, [0])
    line = fig.data[-1]
    middle = (len(fig.data) - 2) / 2
    assert line.x[0] is None
    assert list(line.x[1:]) == pytest.approx([0.05, 0.07, 0.07, 0.09])
    assert list(line.y) == [None, middle, middle, middle, middle]


def test_without_a_path_the_timeline_has_only_its_lanes(analysis: Analysis) -> None:
    bars = timeline_frame(analysis.bubbles.of_ranks([0, 1]), [1], analysis.collectives.offsets_ns)
    assert "critical path" not in {t.name for t in figures.step_timeline(bars, [1]).data}
