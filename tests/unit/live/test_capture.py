"""request_capture's refusals that need a running run: no live windows, one still pending."""

from __future__ import annotations

import pytest

from fsobs.live.capture import CaptureError, request_capture
from fsobs.runformat import RunMeta, StepRecord, write_run_json
from fsobs.runformat.names import sidecar_file_name
from fsobs.runformat.windows import (
    WindowNote,
    WindowSchedule,
    read_capture,
    write_note,
    write_schedule,
)


def _running(run, steps: int) -> None:
    write_run_json(run, RunMeta(name="r", world_size=1, status="incomplete", reason="running"))
    lines = [
        StepRecord.of(s, [3], 1.0, s * 10**8, s * 10**8 + 10**8).to_line() for s in range(steps)
    ]
    (run / (sidecar_file_name(0) + ".partial")).write_text("".join(f"{x}\n" for x in lines))


def test_a_job_without_live_windows_takes_no_request(tmp_path):
    _running(tmp_path, 5)
    with pytest.raises(CaptureError, match="its job takes no capture requests"):
        request_capture(tmp_path, 3)
    assert read_capture(tmp_path) is None


def test_one_request_at_a_time(tmp_path):
    """At step 4 of 100 ms steps, a lead of 1 s is 10 steps: the capture records 15-17. A
    second request is refused until the window is published."""
    _running(tmp_path, 5)
    write_schedule(tmp_path, WindowSchedule(every=0, wait=0, warmup=1, active=1))
    first = request_capture(tmp_path, 3, lead_s=1.0)
    assert (first.first_step, first.last_step) == (15, 17)
    with pytest.raises(CaptureError, match=f"capture {first.request.id} .* is still pending"):
        request_capture(tmp_path, 3, lead_s=1.0)
    note = WindowNote(
        rank=0, first_step=15, last_step=17, trigger="capture", request=first.request.id,
        closed_ns=1,
    )  # fmt: skip
    write_note(tmp_path, note)  # published (no trace here: the index is not asked for)
    assert request_capture(tmp_path, 2, lead_s=1.0).request.id != first.request.id
