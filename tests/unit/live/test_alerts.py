"""The alert rules on hand-built windows and recent steps: each rule firing and not, at its
threshold, with its minimum of windows, and the evidence its message names."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from fsobs.live.alerts import RULES, AlertConfig, evaluate
from fsobs.live.model import Alert, WindowEntry, WindowSummary

CONFIG = AlertConfig()
RANKS = (0, 1, 2, 3)


def _window(
    first: int,
    *,
    bubble: float = 0.2,
    wait: float = 1.0,
    late: dict[int, int] | None = None,
    causes: dict[str, float] | None = None,
    state: str = "closed",
    published: tuple[int, ...] = RANKS,
    missed: dict[int, str] | None = None,
) -> WindowEntry:
    """A window of 4 steps from ``first``; ``late``: rank -> steps it was the straggler in."""
    late = late or {}
    summary = WindowSummary(
        num_steps=4,
        step_ms=100.0,
        bubble_ratio=bubble,
        bubble_ms_per_step=100.0 * bubble,
        classes_ms_per_step={"straggler_wait": wait},
        straggler=max(late, key=lambda r: late[r]) if late else None,
        straggler_wait_ms_per_step=wait,
        late_steps=late,
        causes=causes or {},
        imbalance_before=None,
        imbalance_after=None,
        analyzed_ns=0,
    )
    return WindowEntry(
        wid=f"w{first:08d}",
        first_step=first,
        last_step=first + 3,
        trigger="schedule",
        request=None,
        state=state,
        published=published,
        missed=missed or {},
        summary=summary if state == "closed" else None,
    )


def _recent(
    est: dict[int, float] | None = None, gc_ms: dict[int, float] | None = None
) -> pd.DataFrame:
    """Steps 10-14 of 4 ranks, 100 ms each; ``est``/``gc_ms``: rank -> per step (1.0 / 0.0
    for the ranks not named)."""
    rows = [
        {
            "rank": r,
            "step": s,
            "wall_ms": 100.0,
            "est_cost": (est or {}).get(r, 1.0),
            "gc_ms": (gc_ms or {}).get(r, 0.0),
            "gc_count": 1 if (gc_ms or {}).get(r) else 0,
            "cpu_ms": 90.0,
            "nivcsw": 0,
        }
        for s in range(10, 15)
        for r in RANKS
    ]
    return pd.DataFrame(rows)


def _alert(
    name: str, windows: list[WindowEntry], recent: pd.DataFrame | None = None, **config: Any
) -> Alert:
    alerts = evaluate(windows, _recent() if recent is None else recent, AlertConfig(**config))
    return next(a for a in alerts if a.name == name)


def test_every_rule_is_listed_in_order_and_quiet_on_a_steady_run() -> None:
    windows = [_window(4 * i, late={i % 4: 1}) for i in range(6)]
    alerts = evaluate(windows, _recent(), CONFIG)
    assert tuple(a.name for a in alerts) == RULES
    assert not [a for a in alerts if a.firing]
    assert all(a.message and "\n" not in a.message for a in alerts)
    assert [a.firing for a in evaluate([], pd.DataFrame(), CONFIG)] == [False] * len(RULES)


def test_bubble_ratio_up_fires_at_threshold_times_the_median_of_earlier_windows() -> None:
    earlier = [_window(0, bubble=0.2), _window(4, bubble=0.3), _window(8, bubble=0.25)]
    # median 0.25: 1.5 x 0.25 = 0.375 fires, just below does not
    alert = _alert("bubble_ratio_up", [*earlier, _window(12, bubble=0.375)])
    assert alert.firing and alert.window == "w00000012"
    assert alert.evidence["baseline"] == 0.25 and alert.evidence["ratio"] == pytest.approx(1.5)
    for text in ("w00000012 (steps 12-15)", "37.5%", "25.0%", "3 earlier"):
        assert text in alert.message
    assert not _alert("bubble_ratio_up", [*earlier, _window(12, bubble=0.374)]).firing
    assert _alert("bubble_ratio_up", [*earlier, _window(12, bubble=0.3)], threshold=1.2).firing


def test_a_rise_needs_min_windows_earlier_closed_windows() -> None:
    windows = [_window(0, wait=1.0), _window(4, wait=1.0), _window(8, wait=10.0)]
    alert = _alert("straggler_wait_up", windows)
    assert not alert.firing and "2 earlier window(s), 3 needed" in alert.message
    assert _alert("straggler_wait_up", windows, min_windows=2).firing
    # windows that are not closed neither count as earlier nor as the latest
    pending = [_window(0), _window(4), _window(8, state="pending"), _window(12, wait=10.0)]
    assert not _alert("straggler_wait_up", pending).firing
    assert not _alert("straggler_wait_up", [*windows, _window(12, state="bad")]).firing


def test_straggler_wait_up_skips_unmeasured_windows() -> None:
    windows = [_window(0, wait=math.nan), *(_window(4 * i, wait=2.0) for i in (1, 2, 3))]
    alert = _alert("straggler_wait_up", [*windows, _window(16, wait=3.0)])
    assert alert.firing and alert.evidence["earlier"] == 3  # the NaN window is not counted
    assert "3.00 ms per step" in alert.message and "2.00 ms per step" in alert.message
    latest_nan = _alert("straggler_wait_up", [*windows, _window(16, wait=math.nan)])
    assert not latest_nan.firing and "none measured in w00000016" in latest_nan.message


def test_late_rank_fires_at_late_share_of_the_recent_windows_steps() -> None:
    # rank 1 late in every step of an old window, outside the 3 recent ones
    old = _window(0, late={1: 4})
    recent = [
        _window(4, late={2: 3, 0: 1}),
        _window(8, late={2: 3, 1: 1}),
        _window(12, late={2: 2, 3: 2}),
    ]
    alert = _alert("late_rank", [old, *recent])
    # rank 2: 8 of the 12 steps with a straggler (67% >= 60%)
    assert alert.firing and alert.rank == 2 and alert.window == "w00000012"
    assert alert.evidence["share"] == pytest.approx(8 / 12)
    assert (
        "8 of the 12 steps" in alert.message
        and "w00000004..w00000012 (steps 4-15)" in alert.message
    )
    assert not _alert("late_rank", [old, *recent], late_share=0.7).firing
    # with 4 recent windows, rank 2 has 8 of 16 (50%)
    assert not _alert("late_rank", [old, *recent], recent_windows=4).firing
    # it waits for recent_windows closed windows: rank 2 late in every step of 2 is not enough
    early = _alert("late_rank", [_window(0, late={2: 4}), _window(4, late={2: 4})])
    assert not early.firing and "2 closed window(s), 3 needed" in early.message


def test_late_rank_cause_from_the_windows_causes() -> None:
    node = {"data": 0.1, "gc": 0.05, "preemption": 0.0, "unexplained": 0.85}
    data = {"data": 0.8, "gc": 0.0, "preemption": 0.0, "unexplained": 0.2}
    slow = _alert("late_rank", [_window(0, late={2: 4}, causes=node)], recent_windows=1)
    assert slow.firing and slow.cause == "node"
    assert "gc 5%, preemption 0%, unexplained 85% of its wait (data 10%)" in slow.message
    assert "1.00x the other ranks' median" in slow.message
    shifted = _alert("late_rank", [_window(0, late={2: 4}, causes=data)], recent_windows=1)
    assert shifted.cause == "data" and "data caused 80%" in shifted.message


def test_late_rank_weighs_the_causes_by_each_windows_wait() -> None:
    """All data in a window of 1 ms wait, none in one of 3 ms: 25% data (not the 50% of an
    unweighted mean, which would make it data at data_share 0.5)."""
    all_data = {"data": 1.0, "gc": 0.0, "preemption": 0.0, "unexplained": 0.0}
    no_data = {"data": 0.0, "gc": 0.0, "preemption": 0.0, "unexplained": 1.0}
    windows = [
        _window(0, wait=1.0, late={2: 4}, causes=all_data),
        _window(4, wait=3.0, late={2: 4}, causes=no_data),
    ]
    alert = _alert("late_rank", windows, recent_windows=2)
    assert alert.cause == "node"
    assert alert.evidence["causes"]["data"] == pytest.approx(0.25)


def test_late_rank_cause_from_est_cost_without_causes() -> None:
    windows = [_window(0, late={2: 4})]
    # rank 2's samples cost 1.3x the others': its data
    alert = _alert("late_rank", windows, _recent(est={2: 1.3}), recent_windows=1)
    assert alert.cause == "data" and "1.30x the other ranks' median" in alert.message
    assert _alert("late_rank", windows, _recent(est={2: 1.1}), recent_windows=1).cause == "node"
    no_cost = _recent().assign(est_cost=math.nan)
    alert = _alert("late_rank", windows, no_cost, recent_windows=1)
    assert alert.firing and alert.cause == "unexplained" and "no causes" in alert.message
    # a window that could not split its wait (NaN shares, null once read back from JSON)
    unsplit = _window(
        0, late={2: 4}, causes=dict.fromkeys(("data", "gc", "preemption", "unexplained"), math.nan)
    )
    assert unsplit.summary is not None
    read_back = replace(unsplit, summary=WindowSummary.from_json(unsplit.summary.to_json()))
    for window in (unsplit, read_back):
        assert (
            _alert("late_rank", [window], _recent(est={2: 1.3}), recent_windows=1).evidence[
                "causes"
            ]
            is None
        )


def test_gc_storm_fires_at_gc_share_of_a_ranks_recent_wall_time() -> None:
    alert = _alert("gc_storm", [], _recent(gc_ms={1: 10.0}))
    assert alert.firing and alert.rank == 1
    assert alert.evidence["share"] == pytest.approx(0.1)
    assert "10% of its wall time in steps 10-14" in alert.message
    assert "5 collections, 50.0 ms" in alert.message
    quiet = _alert("gc_storm", [], _recent(gc_ms={1: 9.0}))
    assert not quiet.firing and "9.0%" in quiet.message and "rank 1" in quiet.message
    unknown = _alert("gc_storm", [], _recent().assign(gc_ms=math.nan))
    assert not unknown.firing and "no GC pauses recorded" in unknown.message


def test_window_missing_names_the_window_and_the_ranks() -> None:
    windows = [
        _window(0),
        _window(4, state="missing", published=(0, 2, 3)),
        _window(8, state="missing", published=(0, 1, 3), missed={2: "saw the capture late"}),
        _window(12),
    ]
    alert = _alert("window_missing", windows)
    assert alert.firing and alert.window == "w00000008" and alert.rank is None
    assert "w00000004 (steps 4-7): rank 1 did not publish it" in alert.message
    assert "w00000008 (steps 8-11): rank 2 missed it (saw the capture late)" in alert.message
    assert alert.evidence["w00000004"]["absent"] == [1]
    one = _alert("window_missing", windows[:2])
    assert one.rank == 1 and one.message.startswith("window missing: ")
    assert not _alert("window_missing", [windows[0], windows[3]]).firing


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold", 0.9),
        ("min_windows", 0),
        ("recent_windows", 0),
        ("late_share", 0.0),
        ("gc_share", 1.5),
        ("data_share", -0.1),
        ("cost_margin", 0.5),
    ],
)
def test_alert_config_names_the_bad_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        AlertConfig(**{field: value})
