"""Implausible times are not facts: events far outside their trace's span are left out, and said.

The run is ``write_allreduce_run``'s (tests/support/kineto.py): in step n rank r computes ``c_r``
µs,
then both meet in an all_reduce; with M the larger cost a step's bubble is ``M + 50 - c_r``
in a window of ``M + 50`` µs, the last step's ``M + 20 - c_r`` in ``M + 20``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fsobs.analysis import analyze_path
from fsobs.trace import load_run
from fsobs.trace._plausible import MAX_GAP_NS, describe_outside, far_outside
from tests.support.kineto import write_allreduce_run

COSTS = [(100, 60), (80, 120), (90, 90)]
YEAR_US = 365.25 * 86400e6
DAY_NS = 86400 * 10**9


def _run(tmp_path: Path, change: dict[str, float]) -> Path:
    """The run with ``change`` (key -> value) applied to rank 0's ProfilerStep#1."""
    write_allreduce_run(tmp_path, COSTS)
    path = tmp_path / "rank0.trace.json"
    doc = json.loads(path.read_text())
    first = doc["traceEvents"][0]
    assert first["name"] == "ProfilerStep#1"
    first.update(change)
    path.write_text(json.dumps(doc))
    return tmp_path


def test_a_step_of_31_years_is_left_out_not_counted_as_busy(tmp_path: Path) -> None:
    root = _run(tmp_path, {"dur": 31 * YEAR_US})
    run = load_run(root)
    assert run.warnings == [
        "rank0.trace.json: 1 event(s) far outside the trace's span left out, not counted "
        "(traceEvents[0] 'ProfilerStep#1' lasts 31.0 years; more than a day from the rest "
        "of the trace is a wrong time, not a measurement)"
    ]
    assert run.ranks[0].steps == [2, 3] and run.ranks[1].steps == [1, 2, 3]
    summary = analyze_path(root).summary
    # steps 2 and 3 only (step 1 is gone from rank 0): M = 120 then 90 (the last step)
    bubble = (120 + 50 - 80) + (120 + 50 - 120) + (90 + 20 - 90) + (90 + 20 - 90)
    window = 2 * (120 + 50) + 2 * (90 + 20)
    assert summary["bubble_ratio"] == pytest.approx(bubble / window)


def test_an_event_31_years_late_is_left_out(tmp_path: Path) -> None:
    root = _run(tmp_path, {"ts": 31 * YEAR_US})
    (warning,) = load_run(root).warnings
    assert "traceEvents[0] 'ProfilerStep#1' starts 31.0 years after the others end" in warning


def test_times_within_a_day_are_facts(tmp_path: Path) -> None:
    root = _run(tmp_path, {"dur": 3600e6})  # an hour: long, but a trace can span hours
    run = load_run(root)
    assert run.warnings == [] and run.ranks[0].steps == [1, 2, 3]


def test_far_outside_takes_the_cluster_with_most_times() -> None:
    start = np.array([0, 10, 20, 5 * DAY_NS, 5 * DAY_NS], dtype=np.int64)
    dur = np.array([5, 5, 40 * DAY_NS, 1, 1], dtype=np.int64)
    # times 0 5 10 15 20 | 5d 5d 5d 5d | 40d: the first cluster has 5 of them, the second 4
    assert far_outside(start, dur).tolist() == [False, False, True, True, True]
    assert describe_outside(start, dur, far_outside(start, dur)) == "lasts 40.0 days"


def test_far_outside_of_a_lone_event_and_of_ties() -> None:
    # one event, its start and end 2 days apart: two clusters of one time, the earliest wins
    lone = far_outside(np.array([0]), np.array([2 * DAY_NS]))
    assert lone.tolist() == [True]
    assert describe_outside(np.array([0]), np.array([2 * DAY_NS]), lone) == "lasts 2.0 days"
    # two events 3 days apart: as many times before the gap as after, the earliest wins
    start = np.array([0, 3 * DAY_NS], dtype=np.int64)
    dur = np.array([10, 10], dtype=np.int64)
    mask = far_outside(start, dur)
    assert mask.tolist() == [False, True]
    assert describe_outside(start, dur, mask) == "starts 3.0 days after the others end"


def test_far_outside_of_an_early_event_and_the_limit() -> None:
    start = np.array([0, 4 * DAY_NS, 4 * DAY_NS + 5], dtype=np.int64)
    dur = np.array([1, 10, 10], dtype=np.int64)
    mask = far_outside(start, dur)
    assert mask.tolist() == [True, False, False]
    assert describe_outside(start, dur, mask) == "starts 4.0 days before the others begin"
    # exactly a day between the last end and the next start is still one span
    start = np.array([0, 10 + MAX_GAP_NS], dtype=np.int64)
    assert not far_outside(start, np.array([10, 1])).any()
    assert not far_outside(np.zeros(0, np.int64), np.zeros(0, np.int64)).any()
