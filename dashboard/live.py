"""What the Live page shows of a :class:`~fsobs.live.model.LiveState`, as words and DataFrames
(plain functions, no Streamlit, no Plotly).

Every string that comes from the run (reasons, alert messages, a rank's excuse for a missed
window) is passed through as data: the page draws it in a table, with ``st.text``, or escaped
(:func:`dashboard.text.esc`), never as Markdown.
"""

from __future__ import annotations

import math
import time

import pandas as pd

from dashboard.figures._style import CLASS_COLORS
from fsobs.live import LiveState, WindowEntry, ago

WINDOW_COLUMNS = (
    "window",
    "first step",
    "last step",
    "state",
    "trigger",
    "bubble ratio",
    "step ms",
    "straggler",
    "ranks published",
    "note",
)
ALERT_COLUMNS = ("alert", "firing", "message")
CLASS_COLUMNS = ("window", "first_step", "last_step", "class", "ms_per_step")
BUBBLE_CLASSES = tuple(name for name in CLASS_COLORS if name != "busy")
"""The bubble classes in the order the figures stack them."""


def status_line(state: LiveState) -> str:
    """One line of the run's status, in the dashboard's own words (the reason is not in it):
    ``Running: step 120, 4 ranks, a sidecar grew 3 s ago``, ``Stopped 12 min ago``,
    ``Complete``; how long ago as ``fsobs watch`` says it, left out when unknown."""
    since = None if state.idle_s is None or not math.isfinite(state.idle_s) else state.idle_s
    if state.status == "running":
        step = "no step yet" if state.step is None else f"step {state.step}"
        ranks = "" if state.world_size is None else f", {state.world_size} ranks"
        grew = "" if since is None else f", a sidecar grew {ago(since)} ago"
        return f"Running: {step}{ranks}{grew}"
    if state.status == "stopped":
        return "Stopped" if since is None else f"Stopped {ago(since)} ago"
    return "Complete"


def windows_frame(state: LiveState) -> pd.DataFrame:
    """One row per window of the index, in step order: :data:`WINDOW_COLUMNS`; ``bubble
    ratio``, ``step ms`` and ``straggler`` only for closed windows, ``note`` says what a
    pending, missing or bad window lacks."""
    rows = []
    for window in state.windows:
        summary = window.summary if window.state == "closed" else None
        rows.append(
            {
                "window": window.wid,
                "first step": window.first_step,
                "last step": window.last_step,
                "state": window.state,
                "trigger": window.trigger,
                "bubble ratio": math.nan if summary is None else summary.bubble_ratio,
                "step ms": math.nan if summary is None else summary.step_ms,
                "straggler": None if summary is None else summary.straggler,
                "ranks published": len(window.published),
                "note": _note(window, state.world_size),
            }
        )
    frame = pd.DataFrame(rows, columns=list(WINDOW_COLUMNS))
    return frame.astype({"straggler": "Int64", "bubble ratio": float, "step ms": float})


def _note(window: WindowEntry, world_size: int | None) -> str:
    parts = [f"rank {rank}: {why}" for rank, why in sorted(window.missed.items())]
    if window.state == "bad" and window.error:
        parts.append(window.error)
    if window.state == "pending" and world_size is not None:
        waiting = sorted(set(range(world_size)) - set(window.published))
        if waiting:
            parts.append("waiting for rank(s) " + ", ".join(map(str, waiting)))
    return "; ".join(parts)


def classes_frame(state: LiveState) -> pd.DataFrame:
    """Bubble class ms per rank and step of each closed window, long: :data:`CLASS_COLUMNS`,
    classes in :data:`BUBBLE_CLASSES` order (any other class after them)."""
    rows = []
    for window in state.closed_windows:
        if window.summary is None:
            continue
        classes = window.summary.classes_ms_per_step
        order = [c for c in BUBBLE_CLASSES if c in classes]
        order += sorted(set(classes) - set(order))
        for name in order:
            rows.append(
                {
                    "window": window.wid,
                    "first_step": window.first_step,
                    "last_step": window.last_step,
                    "class": name,
                    "ms_per_step": classes[name],
                }
            )
    return pd.DataFrame(rows, columns=list(CLASS_COLUMNS))


def alerts_frame(state: LiveState) -> pd.DataFrame:
    """Every rule's alert, the firing ones first (each group in the rules' order):
    :data:`ALERT_COLUMNS`."""
    ordered = sorted(state.alerts, key=lambda a: not a.firing)
    rows = [{"alert": a.name, "firing": a.firing, "message": a.message} for a in ordered]
    return pd.DataFrame(rows, columns=list(ALERT_COLUMNS))


def ranks_frame(state: LiveState) -> pd.DataFrame:
    """Each rank's sidecar as it grows: rank, steps read, last step, recent step ms, seconds
    since it grew, closed."""
    rows = [
        {
            "rank": r.rank,
            "steps read": r.num_steps,
            "last step": r.last_step,
            "step ms": math.nan if r.step_ms is None else r.step_ms,
            "idle s": r.idle_s,
            "closed": r.closed,
        }
        for r in state.ranks
    ]
    columns = ["rank", "steps read", "last step", "step ms", "idle s", "closed"]
    return pd.DataFrame(rows, columns=columns).astype({"last step": "Int64"})


def slowest_step_ms(state: LiveState) -> float | None:
    """The largest of the ranks' recent median step times (the run goes at that pace)."""
    times = [r.step_ms for r in state.ranks if r.step_ms is not None]
    return max(times) if times else None


def capture_line(capture: dict[str, object] | None) -> str | None:
    """The latest capture request in one line (``steps 120-124 (c1733-ab12cd): pending, in
    w00000120``), None without one."""
    if capture is None:
        return None
    start, steps = capture.get("start_step"), capture.get("steps")
    span = (
        f"steps {start}-{start + steps - 1}"
        if isinstance(start, int) and isinstance(steps, int)
        else "steps unknown"
    )
    line = f"{span} ({capture.get('id')}): {capture.get('state')}"
    window = capture.get("window")
    return line if window is None else f"{line}, in {window}"


def clock(ns: int) -> str:
    """A wall-clock time in ns since the epoch as ``HH:MM:SS UTC``."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(ns / 1e9))
