"""The live layout: the schedule's windows, where a capture lands, the notes and requests."""

from __future__ import annotations

import json

import pytest

from fsobs.errors import TraceFormatError
from fsobs.runformat.names import is_trace_name
from fsobs.runformat.windows import (
    CaptureRequest,
    WindowNote,
    WindowSchedule,
    list_windows,
    published_ranks,
    read_capture,
    read_note,
    write_capture,
    write_note,
)

# a cycle of 10 steps: step 0 waits, step 1 warms up, 2-4 are recorded; then 12-14, 22-24
SCHEDULE = WindowSchedule(every=10, wait=1, warmup=1, active=3)


def test_scheduled_windows_by_hand():
    assert SCHEDULE.scheduled(0, 30) == [(2, 4), (12, 14), (22, 24)]
    assert SCHEDULE.scheduled(4, 12) == [(2, 4), (12, 14)]  # overlapping the span, either end
    assert SCHEDULE.scheduled(5, 11) == []
    assert WindowSchedule(every=0, wait=0, warmup=1, active=1).scheduled(0, 100) == []


@pytest.mark.parametrize(
    ("start", "steps", "taken", "placed"),
    [
        (7, 3, [], (7, 9)),  # warm-up 6, recorded 7-9: clear of 2-4 and of 12-14's warm-up 11
        (8, 3, [], (8, 10)),  # ends at 10, the step before 12-14's warm-up
        (3, 2, [], (6, 7)),  # would begin inside 2-4: after it, past one warm-up step (5)
        (5, 2, [], (6, 7)),  # its warm-up (4) is 2-4's last step: moved the same
        (1, 2, [], (1, 2)),  # begins before 2-4 (warm-up 0): 2-4 gives way to it
        (9, 3, [], (9, 11)),  # runs into 12-14's warm-up: 12-14 gives way
        (6, 2, [(7, 8)], (10, 11)),  # past an earlier capture 7-8 (its warm-up 9), then clear
        (12, 2, [(11, 13)], (15, 16)),  # past 11-13 into 12-14, which gave way to 11-13
    ],
)
def test_a_capture_is_placed_by_one_rule(start, steps, taken, placed):
    assert SCHEDULE.place(start, steps, taken) == placed


def test_scheduled_windows_give_way_to_a_capture_they_overlap():
    assert SCHEDULE.gives_way((2, 4), [(1, 2)])
    assert SCHEDULE.gives_way((12, 14), [(9, 11)])  # 11 is its warm-up step
    assert not SCHEDULE.gives_way((12, 14), [(8, 10)])
    assert not SCHEDULE.gives_way((2, 4), [(6, 7)])  # 6-7's warm-up 5 is after 4


def test_a_cycle_must_hold_its_window():
    with pytest.raises(ValueError, match="every: a cycle of 4 steps cannot hold"):
        WindowSchedule(every=4, wait=1, warmup=1, active=3)
    with pytest.raises(ValueError, match="warmup: must be an integer >= 1"):
        WindowSchedule(every=10, wait=1, warmup=0, active=3)


def _note(rank: int, **fields) -> WindowNote:
    values = dict(rank=rank, first_step=12, last_step=14, trigger="schedule", closed_ns=5)
    return WindowNote(**(values | fields))


def test_notes_round_trip_and_list_by_window(tmp_path):
    write_note(tmp_path, _note(0))
    write_note(tmp_path, _note(1))
    missed = _note(1, first_step=30, last_step=31, trigger="capture", request="c1-ab")
    write_note(tmp_path, missed.__class__(**(missed.to_json() | {"missed": "saw it late"})))
    (tmp_path / "windows" / "w00000012" / "window.rank2.json").write_text("{")
    windows = list_windows(tmp_path)
    assert [w.wid for w in windows] == ["w00000012", "w00000030"]
    assert sorted(windows[0].notes) == [0, 1] and windows[0].notes[1] == _note(1)
    assert list(windows[0].bad) == ["window.rank2.json"]  # listed as bad, never raised
    assert published_ranks(tmp_path) == {0, 1}  # rank 1's missed capture is no window
    assert not is_trace_name("window.rank0.json") and not is_trace_name("summary.json")
    assert is_trace_name("rank0.trace.json.gz")


def test_a_note_is_checked_and_must_sit_in_its_window(tmp_path):
    with pytest.raises(ValueError, match="request: a capture window names its request"):
        _note(0, trigger="capture")
    with pytest.raises(ValueError, match="last_step: 11 before first_step 12"):
        _note(0, last_step=11)
    path = write_note(tmp_path, _note(0))
    moved = path.with_name("window.rank3.json")
    path.rename(moved)
    with pytest.raises(TraceFormatError, match="misplaced"):
        read_note(moved)


def test_capture_requests_round_trip_and_bad_ones_are_named(tmp_path):
    assert read_capture(tmp_path) is None
    request = CaptureRequest.new(start_step=40, steps=3)
    write_capture(tmp_path, request)
    assert read_capture(tmp_path) == request and request.last_step == 42
    (tmp_path / "capture.json").write_text(json.dumps(request.to_json() | {"steps": 0}))
    with pytest.raises(TraceFormatError, match=r"capture.json: bad capture request: steps"):
        read_capture(tmp_path)
