"""Asking a running job to profile its next steps (``fsobs capture RUN --steps K``).

The request goes into the run folder (``capture.json``, :mod:`fsobs.runformat.windows`),
naming a first step far enough past the job's progress that every rank sees it before then:
the fastest rank's last step, plus the steps of ``lead_s`` seconds (at least
:data:`MIN_LEAD_STEPS`). The ranks place it by the rule they share (past a scheduled window it
would begin in), as :func:`request_capture` reports. One request at a time: a second one while
the first has not been published is refused, so that every rank sees every request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from fsobs.errors import FsobsError
from fsobs.live.state import LiveConfig, LiveRun, capture_spans
from fsobs.runformat.windows import (
    CaptureRequest,
    read_schedule,
    window_dir,
    write_capture,
)

MIN_LEAD_STEPS = 2
MAX_CAPTURE_STEPS = 1000
"""The most steps one capture records (a trace per step; a larger one is likely a typo)."""


class CaptureError(FsobsError):
    """A capture that cannot be asked for, in one line."""


@dataclass(frozen=True)
class Capture:
    """A request written, and where its window will appear."""

    request: CaptureRequest
    first_step: int
    last_step: int
    window: Path


def request_capture(run_dir: str | Path, steps: int, *, lead_s: float = 3.0) -> Capture:
    """Ask the job writing ``run_dir`` to record ``steps`` steps soon (module docstring);
    :class:`CaptureError` (or another ``FsobsError``) naming the run when it cannot: no run
    there, the run is complete or stopped, its job takes no requests, one is pending."""
    root = Path(run_dir)
    if type(steps) is not int or not 1 <= steps <= MAX_CAPTURE_STEPS:
        raise CaptureError(
            f"steps: must be an integer from 1 to {MAX_CAPTURE_STEPS}, got {steps!r}"
        )
    state = LiveRun(root, LiveConfig(index=False)).poll()
    if state.status == "complete":
        raise CaptureError("the run is complete: there is nothing left to capture", path=root)
    if state.status == "stopped":
        raise CaptureError(f"the run has stopped ({state.reason}): nothing to capture", path=root)
    schedule = read_schedule(root)
    if schedule is None:
        raise CaptureError(
            "its job takes no capture requests (profile it in live windows: fsobs run "
            "--profile-window K or --profile-every 0, ProfilerConfig(every=N))",
            path=root,
        )
    if state.capture is not None and state.capture.get("state") in ("requested", "pending"):
        raise CaptureError(
            f"capture {state.capture.get('id')} (from step {state.capture.get('start_step')}) "
            "is still pending: ask again once it is published",
            path=root,
        )
    last = max((r.last_step for r in state.ranks if r.last_step is not None), default=-1)
    times = [r.step_ms for r in state.ranks if r.step_ms]
    lead = MIN_LEAD_STEPS
    if times and lead_s > 0:
        lead = max(lead, math.ceil(lead_s * 1000 / max(min(times), 1e-3)))
    request = CaptureRequest.new(start_step=max(1, last + 1 + lead), steps=steps)
    first, end = schedule.place(request.start_step, steps, capture_spans(state.windows))
    write_capture(root, request)
    return Capture(request=request, first_step=first, last_step=end, window=window_dir(root, first))
