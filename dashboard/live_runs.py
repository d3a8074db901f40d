"""The Live page's state across refreshes: one :class:`~fsobs.live.state.LiveRun` per run and
session, and the capture request it sends."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path

import streamlit as st

from fsobs import FsobsError
from fsobs.live import LiveConfig, LiveRun, request_capture
from fsobs.runformat import WINDOWS_DIR

REFRESH: dict[str, float | None] = {
    "2 s": 2.0,
    "5 s": 5.0,
    "10 s": 10.0,
    "30 s": 30.0,
    "paused": None,
}
"""The refresh intervals offered (label -> seconds; ``paused``: no refresh)."""
RUNS_KEY = "live_runs"
MAX_RUNS = 8
"""Runs a session keeps a reader of; the one used longest ago is dropped beyond this."""


def live_run(path: Path) -> LiveRun:
    """The session's reader of the run in ``path`` (made on first use, then reused: each poll
    reads only what is new)."""
    readers: MutableMapping[str, LiveRun] = st.session_state.setdefault(RUNS_KEY, {})
    key = str(path)
    reader = readers.pop(key, None) or LiveRun(path, LiveConfig())
    readers[key] = reader  # last used, last in order
    while len(readers) > MAX_RUNS:
        del readers[next(iter(readers))]
    return reader


def request(store: Path, path: Path, steps: int) -> tuple[bool, str]:
    """Ask the job of the run in ``path`` to profile ``steps`` steps soon: (done, one line
    saying which steps or why not)."""
    try:
        capture = request_capture(path, steps)
    except FsobsError as exc:
        return False, f"Capture refused: {one_line(exc, store)}"
    except OSError as exc:
        return False, f"Capture refused: the run store refused it ({exc.strerror or exc})"
    return True, (
        f"Capture {capture.request.id} requested: steps {capture.first_step}-"
        f"{capture.last_step} will be recorded, in {WINDOWS_DIR}/{capture.window.name}"
    )


def one_line(exc: Exception, store: Path) -> str:
    """An error's message on one line, paths relative to the store (as the other pages say
    them)."""
    return " ".join(str(exc).replace(f"{store}/", "").split())
