"""Live windows in one process: what torch's profiler records, step by step, with captures.

The loop follows torch's convention (``prof.step()`` after each step). Every window's trace must
hold exactly its steps' ``ProfilerStep#N`` ranges, so what the schedule says is checked
against what torch did."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import torch

from fsobs.collect.profiler import ProfilerConfig, StepProfiler
from fsobs.runformat.windows import CaptureRequest, list_windows, read_schedule, write_capture


def _steps_in(trace: Path) -> list[int]:
    with gzip.open(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return sorted(
        int(e["name"].split("#")[1])
        for e in events
        if e.get("name", "").startswith("ProfilerStep#")
    )


def _train(run: Path, config: ProfilerConfig, steps: int, requests: dict[int, tuple[int, int]]):
    x = torch.ones(64, 64)
    with StepProfiler(run, 0, config) as prof:
        for step in range(steps):
            if step in requests:
                start, count = requests[step]
                write_capture(run, CaptureRequest.new(start_step=start, steps=count))
                os.utime(run / "capture.json", ns=(step + 1, step + 1))  # a new mtime each
            with torch.profiler.record_function("work"):
                (x @ x).sum()
            prof.step()
    return prof


def test_scheduled_and_captured_windows_record_exactly_their_steps(tmp_path):
    """Windows of 2 every 6 (2-3, 8-9, 14-15, 20-21 in 22 steps) and, asked for at step 3, a
    capture of 3 steps from 9: it would begin inside 8-9, so it records 11-13 (warm-up 10),
    and 14-15 gives way to it (its warm-up 13 is the capture's). A capture asked for at step
    16 from step 12 goes past 11-13 to 15-16 (14-15 gave way), seen after step 16: the rank
    notes it missed, and records nothing for it. 20-21 closes with the loop's last step()."""
    config = ProfilerConfig(every=6, active=2)
    prof = _train(tmp_path, config, 22, {3: (9, 3), 16: (12, 2)})
    windows = {w.wid: w for w in list_windows(tmp_path)}
    assert sorted(windows) == ["w00000002", "w00000008", "w00000011", "w00000015", "w00000020"]
    for wid, steps in (
        ("w00000002", [2, 3]),
        ("w00000008", [8, 9]),
        ("w00000011", [11, 12, 13]),
        ("w00000020", [20, 21]),
    ):
        note = windows[wid].notes[0]
        assert list(note.steps) == steps and note.missed is None
        assert _steps_in(windows[wid].path / "rank0.trace.json.gz") == steps
    assert windows["w00000011"].notes[0].trigger == "capture"
    missed = windows["w00000015"].notes[0]
    assert missed.missed == "rank 0 saw the request at step 17, after step 15"
    assert not (windows["w00000015"].path / "rank0.trace.json.gz").exists()
    assert read_schedule(tmp_path) == config.schedule
    assert prof.published and not (tmp_path / "rank0.trace.json.gz").exists()


def test_captures_only(tmp_path):
    """``every=0``: no window but the one asked for (steps 4-5, asked for at step 1)."""
    _train(tmp_path, ProfilerConfig(every=0, active=1), 8, {1: (4, 2)})
    [window] = list_windows(tmp_path)
    assert window.wid == "w00000004"
    assert _steps_in(window.path / "rank0.trace.json.gz") == [4, 5]
