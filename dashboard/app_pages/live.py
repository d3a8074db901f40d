"""Live: a run while its job writes it, refreshed in place (``/live?run=<id>``).

Only the view below the pickers reruns on each refresh (``st.fragment(run_every=...)``): the
picked run, the refresh interval and the capture widgets keep their state, and the charts keep
their zoom (``uirevision``). Each session keeps one :class:`~fsobs.live.state.LiveRun` per run
(:func:`dashboard.live_runs.live_run`), so a refresh reads only what the job wrote since.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from plotly.graph_objects import Figure

from dashboard import figures, live
from dashboard.cache import runs
from dashboard.live_runs import REFRESH, live_run, one_line, request
from dashboard.numbers import ms, ratio
from dashboard.store import is_read_only, live_first, run_state
from dashboard.text import esc
from dashboard.widgets import chart, current_store, pick_run, stop, stop_without_runs, table
from fsobs import FsobsError
from fsobs.live import MAX_CAPTURE_STEPS, LiveRun, LiveState

RESULT_KEY = "live_capture_result"


def _store() -> Path:
    """The run store; the page ends on a URL store (``LiveRun`` reads local files)."""
    store = current_store()
    if not isinstance(store, Path):
        stop("This run store is a URL: live views read a local store only.")
    assert isinstance(store, Path)
    return store


def _pick_run() -> tuple[str, Path]:
    """The ``run`` picker over the store's runs, running ones first (default: the first)."""
    store = _store()
    entries = runs(store)
    stop_without_runs(entries)
    ordered = live_first(entries, [run_state(e)[0] for e in entries])
    entry = pick_run("Run (running ones first)", "run", ordered, lambda: ordered[0].run_id)
    assert isinstance(entry.path, Path)  # a local store
    return entry.run_id, entry.path


def _status(state: LiveState) -> None:
    line = live.status_line(state)
    if state.reason:
        line += f". Reason: {esc(state.reason)}"
    {"running": st.success, "stopped": st.warning}.get(state.status, st.info)(line)
    columns = st.columns(5)
    columns[0].metric("Step", "n/a" if state.step is None else f"{state.step:,}")
    columns[1].metric(
        "Step time",
        ms(live.slowest_step_ms(state)),
        help="The slowest rank's median wall time over its recent steps.",
    )
    columns[2].metric("Imbalance, random split", ratio(state.imbalance_before))
    columns[3].metric("Imbalance, split used", ratio(state.imbalance_after))
    late = state.late_rank
    columns[4].metric(
        "Late rank",
        "none" if late is None else f"rank {late.rank}",
        help="The rank late in most recent steps, from the recent closed windows.",
    )


def _alerts(state: LiveState) -> None:
    """Each firing alert in a box of its own, then every rule in a table (firing first)."""
    st.subheader(f"Alerts ({len(state.firing)} firing)")
    for alert in state.firing:
        st.error(esc(f"{alert.name}: {alert.message}"), icon=":material/warning:")
    with st.expander(f"Every rule ({len(state.alerts)})"):
        table(live.alerts_frame(state), key="live_alerts")


def _trend(run_id: str, reader: LiveRun, state: LiveState) -> None:
    """Step time and imbalance per step, then the windows: bubble ratio, classes, table."""
    st.subheader("Over the run's life")
    trend = reader.trend()
    windows = live.windows_frame(state)
    left, right = st.columns(2)
    with left:
        _chart(figures.step_time_trend(trend, windows), run_id, "live_step_time")
    with right:
        if trend[["imbalance_before", "imbalance_after"]].notna().any(axis=None):
            _chart(figures.imbalance_over_steps(trend), run_id, "live_imbalance")
        else:
            st.caption("The sidecars log no imbalance (the job does not balance its batches).")
    if not state.windows:
        st.caption("No profiling window yet.")
        return
    classes = live.classes_frame(state)
    left, right = st.columns(2)
    with left:
        _chart(figures.bubble_ratio_by_window(windows), run_id, "live_bubble_ratio")
    with right:
        if classes.empty:
            st.caption("No closed window yet: the bubble classes show once one is analyzed.")
        else:
            _chart(figures.classes_by_window(classes), run_id, "live_classes")
    table(
        windows,
        key="live_windows",
        column_config={"bubble ratio": st.column_config.NumberColumn(format="percent")},
    )


def _chart(fig: Figure, run_id: str, key: str) -> None:
    """A chart that keeps the user's zoom across refreshes (``uirevision``: the run)."""
    chart(fig.update_layout(uirevision=run_id), key)


def _ranks(state: LiveState) -> None:
    with st.expander("Ranks"):
        table(live.ranks_frame(state), key="live_ranks")


def _capture(run_id: str, path: Path, state: LiveState) -> None:
    st.subheader("Capture")
    latest = live.capture_line(state.capture)
    st.text("Latest request: " + (latest or "none"))
    if state.status != "running":
        st.caption("A capture can be requested while the run is running.")
        return
    if is_read_only(_store()):
        st.caption("This dashboard serves its run store read-only: capture requests are off.")
        return
    steps = st.number_input(
        "Steps to capture",
        min_value=1,
        max_value=MAX_CAPTURE_STEPS,
        value=5,
        key="live_capture_steps",
    )
    st.button(
        f"Capture next {steps} steps", key="live_capture", on_click=_request, args=(run_id, path)
    )
    result = st.session_state.get(RESULT_KEY)
    if result is not None and result[0] == run_id:
        ok, message = result[1]
        (st.success if ok else st.error)(esc(message))


def _request(run_id: str, path: Path) -> None:
    """Button callback: send the request before the view reruns, so its poll shows it."""
    steps = int(st.session_state["live_capture_steps"])
    st.session_state[RESULT_KEY] = (run_id, request(_store(), path, steps))


def _view(run_id: str, path: Path) -> None:
    """The part that refreshes: one poll of the run, drawn. The capture control is offered
    where uploads are (a local store: the page does not open a URL store)."""
    try:
        reader = live_run(path)
        state = reader.poll()
    except (FsobsError, OSError) as exc:  # deleted or rewritten under the page: say it, retry
        st.error(esc(f"Cannot read the run: {one_line(exc, _store())}"))
        return
    _status(state)
    _alerts(state)
    _trend(run_id, reader, state)
    _ranks(state)
    _capture(run_id, path, state)
    st.caption(f"Polled at {live.clock(state.polled_ns)}")


def render() -> None:
    """The page."""
    st.title("Live")
    run_id, path = _pick_run()
    every = st.selectbox("Refresh every", list(REFRESH), index=1, key="live_every")
    assert every is not None
    st.fragment(_view, run_every=REFRESH[every])(run_id, path)


render()
