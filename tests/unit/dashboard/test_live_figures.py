"""The Live page's tables and figures on hand-built states (values worked out by hand)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboard import live
from dashboard.figures import (
    bubble_ratio_by_window,
    classes_by_window,
    imbalance_over_steps,
    step_time_trend,
)
from dashboard.figures.live import STATE_MARKERS
from fsobs.live.model import Alert, LiveState, RankProgress, WindowEntry, WindowSummary


def _summary(
    ratio: float, classes: dict[str, float], straggler: int | None, step_ms: float = 40.0
) -> WindowSummary:
    return WindowSummary(
        num_steps=10,
        step_ms=step_ms,
        bubble_ratio=ratio,
        bubble_ms_per_step=sum(classes.values()),
        classes_ms_per_step=classes,
        straggler=straggler,
        straggler_wait_ms_per_step=classes.get("straggler_wait", 0.0),
        late_steps={} if straggler is None else {straggler: 6},
        causes={},
        imbalance_before=None,
        imbalance_after=None,
        analyzed_ns=0,
    )


def _window(first: int, state: str, **fields: object) -> WindowEntry:
    return WindowEntry(
        wid=f"w{first:08d}",
        first_step=first,
        last_step=first + 9,
        trigger="schedule",
        request=None,
        state=state,
        published=(0, 1) if state == "closed" else (0,),
        **fields,  # type: ignore[arg-type]
    )


def _rank(rank: int, last: int, step_ms: float | None) -> RankProgress:
    return RankProgress(
        rank=rank,
        num_steps=last + 1,
        last_step=last,
        step_ms=step_ms,
        last_ms=41.0,
        est_cost=None,
        gc_ms=None,
        idle_s=2.0,
        closed=False,
    )


def _state(status: str = "running", idle_s: float | None = 3.0, **fields: object) -> LiveState:
    windows = (
        _window(0, "closed", summary=_summary(0.25, {"host_idle": 2.0, "straggler_wait": 8.0}, 1)),
        _window(10, "missing", missed={1: "saw the request at step 12"}),
        _window(
            20, "closed", summary=_summary(0.5, {"straggler_wait": 16.0, "other": 4.0}, None, 55.0)
        ),
        _window(30, "bad", error="rank1.trace.json.gz: not gzip"),
        _window(40, "pending"),
    )
    alerts = (
        Alert(name="bubble_ratio_up", firing=False, message="bubble ratio steady"),
        Alert(name="straggler_wait_up", firing=True, message="*wait* up in w00000020"),
        Alert(name="late_rank", firing=False, message="no late rank"),
        Alert(name="window_missing", firing=True, message="w00000010: rank 1 missed it"),
    )
    values: dict[str, object] = {
        "run": "/store/live",
        "name": "live",
        "status": status,
        "reason": None,
        "idle_s": idle_s,
        "world_size": 2,
        "step": 47,
        "ranks": (_rank(0, 48, 40.0), _rank(1, 47, 45.5)),
        "imbalance_before": None,
        "imbalance_after": None,
        "late_rank": None,
        "windows": windows,
        "alerts": alerts,
        "capture": None,
        "polled_ns": 0,
    }
    return LiveState(**(values | fields))  # type: ignore[arg-type]


def _marker(state: str) -> str:
    """The legend name of the markers of windows in ``state``."""
    return STATE_MARKERS[state][2]


def test_status_line_says_running_stopped_since_and_complete() -> None:
    assert live.status_line(_state()) == "Running: step 47, 2 ranks, a sidecar grew 3 s ago"
    assert live.status_line(_state("stopped", idle_s=12 * 60 + 59)) == "Stopped 12 min ago"
    assert live.status_line(_state("stopped", idle_s=2 * 3600 + 5 * 60)) == "Stopped 2 h 5 min ago"
    assert live.status_line(_state("stopped", idle_s=None)) == "Stopped"
    assert live.status_line(_state("stopped", idle_s=math.inf)) == "Stopped"  # no sidecar yet
    assert live.status_line(_state("complete")) == "Complete"
    assert live.status_line(_state(step=None, world_size=None, idle_s=None)) == (
        "Running: no step yet"
    )


def test_windows_frame_keeps_every_window_and_names_what_the_open_ones_lack() -> None:
    frame = live.windows_frame(_state())
    assert list(frame.columns) == list(live.WINDOW_COLUMNS)
    assert list(frame["state"]) == ["closed", "missing", "closed", "bad", "pending"]
    assert list(frame["first step"]) == [0, 10, 20, 30, 40]
    np.testing.assert_array_equal(frame["bubble ratio"], [0.25, np.nan, 0.5, np.nan, np.nan])
    assert list(frame["straggler"].astype(object)) == [1, pd.NA, pd.NA, pd.NA, pd.NA]
    assert list(frame["note"]) == [
        "",
        "rank 1: saw the request at step 12",
        "",
        "rank1.trace.json.gz: not gzip",
        "waiting for rank(s) 1",
    ]


def test_classes_frame_stacks_the_closed_windows_in_the_figures_order() -> None:
    frame = live.classes_frame(_state())
    assert list(frame.columns) == list(live.CLASS_COLUMNS)
    rows = list(frame[["window", "class", "ms_per_step"]].itertuples(index=False, name=None))
    assert rows == [
        ("w00000000", "straggler_wait", 8.0),
        ("w00000000", "host_idle", 2.0),
        ("w00000020", "straggler_wait", 16.0),
        ("w00000020", "other", 4.0),
    ]


def test_alerts_frame_puts_the_firing_ones_first_in_rule_order() -> None:
    frame = live.alerts_frame(_state())
    assert list(frame["alert"]) == [
        "straggler_wait_up",
        "window_missing",
        "bubble_ratio_up",
        "late_rank",
    ]
    assert list(frame["firing"]) == [True, True, False, False]
    assert frame["message"].iloc[0] == "*wait* up in w00000020"  # the run's text, as it is


def test_ranks_frame_and_capture_line() -> None:
    frame = live.ranks_frame(_state())
    assert list(frame["rank"]) == [0, 1] and list(frame["last step"]) == [48, 47]
    assert live.slowest_step_ms(_state()) == 45.5
    assert live.slowest_step_ms(_state(ranks=(_rank(0, 1, None),))) is None
    assert live.capture_line(None) is None
    capture = {"id": "c1-ab", "start_step": 120, "steps": 5, "window": None, "state": "pending"}
    assert live.capture_line(capture) == "steps 120-124 (c1-ab): pending"
    capture |= {"window": "w00000120", "state": "closed"}
    assert live.capture_line(capture) == "steps 120-124 (c1-ab): closed, in w00000120"


def test_bubble_ratio_figure_draws_closed_windows_and_marks_the_others() -> None:
    fig = bubble_ratio_by_window(live.windows_frame(_state()))
    by_name = {trace.name: trace for trace in fig.data}
    closed = by_name["closed window"]
    assert list(closed.x) == [0, 20] and list(closed.y) == pytest.approx([25.0, 50.0])
    assert list(by_name[_marker("missing")].x) == [10]
    assert list(by_name[_marker("bad")].x) == [30]
    assert list(by_name[_marker("pending")].x) == [40]
    assert fig.layout.title.text == "Bubble ratio per window (2 of 5 closed)"


def test_bubble_ratio_figure_without_open_windows_has_one_trace() -> None:
    only_closed = _state(windows=_state().closed_windows)
    fig = bubble_ratio_by_window(live.windows_frame(only_closed))
    assert [trace.name for trace in fig.data] == ["closed window"]


def test_classes_figure_stacks_one_bar_per_window_over_its_steps() -> None:
    fig = classes_by_window(live.classes_frame(_state()))
    assert fig.layout.barmode == "stack"
    bars = {trace.name: trace for trace in fig.data}
    assert list(bars) == ["straggler wait", "host idle", "other"]
    assert list(bars["straggler wait"].x) == [0, 20]
    assert list(bars["straggler wait"].y) == [8.0, 16.0]
    assert list(bars["straggler wait"].width) == [10, 10]  # steps 0-9 and 20-29
    assert list(bars["other"].x) == [20] and list(bars["other"].y) == [4.0]
    assert fig.layout.title.text == "Bubble classes per window (2 closed)"


def test_trend_figures_take_the_trend_frame() -> None:
    trend = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "step_ms": [40.0, 42.5, math.nan],
            "imbalance_before": [1.5, 1.4, 1.6],
            "imbalance_after": [1.05, 1.02, 1.01],
        }
    )
    fig = step_time_trend(trend, live.windows_frame(_state()))
    assert fig.layout.title.text == "Step time (steps 0-2 read)"
    assert list(fig.data[0].x) == [0, 1, 2]
    np.testing.assert_array_equal(fig.data[0].y, [40.0, 42.5, np.nan])
    imbalance = imbalance_over_steps(trend)
    assert [list(t.y) for t in imbalance.data] == [[1.5, 1.4, 1.6], [1.05, 1.02, 1.01]]


def test_step_time_trend_switches_to_webgl_for_long_runs() -> None:
    steps = np.arange(5000)
    trend = pd.DataFrame({"step": steps, "step_ms": np.full(5000, 40.0)})
    windows = live.windows_frame(_state(windows=()))
    fig = step_time_trend(trend, windows)
    assert fig.data[0].type == "scattergl"
    assert fig.layout.title.text == "Step time (steps 0-4,999 read)"
    empty = step_time_trend(trend.iloc[:0], windows)
    assert empty.layout.title.text == "Step time (no step read yet)"


def test_step_time_trend_marks_each_closed_windows_mean_over_the_runs_life() -> None:
    trend = pd.DataFrame({"step": [45, 46], "step_ms": [41.0, 42.0]})
    windows = live.windows_frame(_state())
    means = step_time_trend(trend, windows).data[1]
    assert means.name == "window mean"
    assert list(means.x) == [0, 20] and list(means.y) == [40.0, 55.0]  # the closed ones
