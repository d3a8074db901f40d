"""Arms: several runs side by side, each against one control (``/arms?control=<id>&runs=a,b``)."""

from __future__ import annotations

import streamlit as st

from dashboard import urlstate
from dashboard.arms import arms_frame, control_among
from dashboard.cache import comparison, is_cheap, load, runs
from dashboard.figures.arms import arm_reductions
from dashboard.pending import loaded_runs
from dashboard.store import RunEntry, parent_of
from dashboard.tables import has_data
from dashboard.text import code, esc
from dashboard.widgets import (
    chart,
    current_store,
    default_control,
    pick_run,
    stop,
    stop_unknown,
    stop_without_runs,
    table,
)
from fsobs.analysis import Comparison
from fsobs.storage import Location

ARMS_KEY = "runs"
MAX_DEFAULT_ARMS = 8
PERCENT = st.column_config.NumberColumn(format="percent")


def _default_arms(store: Location, entries: list[RunEntry], control: str) -> list[str]:
    """The control and the runs of its folder that have data (at most :data:`MAX_DEFAULT_ARMS`,
    cheap ones only: choosing a default never parses a big run)."""
    folder = parent_of(control)
    others = [
        e.run_id
        for e in entries
        if e.run_id != control
        and parent_of(e.run_id) == folder
        and is_cheap(store, e)
        and has_data(load(store, e).analysis)
    ]
    return [control, *others][:MAX_DEFAULT_ARMS]


def _pick_arms(store: Location, entries: list[RunEntry]) -> list[RunEntry]:
    """The arms: a multiselect whose choice is the ``runs`` query parameter (ids joined by
    ``,``; default: the control and its folder's runs)."""
    ids = [e.run_id for e in entries]
    control = urlstate.wanted("control")
    if control is not None and control not in ids:
        if urlstate.in_url("control", control):
            stop_unknown("control", [control])
        control = None  # remembered, deleted since
    value = urlstate.wanted(ARMS_KEY)
    if value is None:
        arms = _default_arms(store, entries, control or default_control(store, entries))
    else:
        arms = urlstate.split(value)
    unknown = [a for a in arms if a not in ids]
    if unknown and value is not None and urlstate.in_url(ARMS_KEY, value):
        stop_unknown(ARMS_KEY, unknown)
    st.session_state[ARMS_KEY] = [a for a in arms if a in ids]
    chosen = st.multiselect("Arms (runs side by side)", ids, key=ARMS_KEY)
    urlstate.keep(ARMS_KEY, urlstate.LIST_SEPARATOR.join(chosen))
    by_id = {e.run_id: e for e in entries}
    return [by_id[a] for a in chosen]  # in the order chosen


def render() -> None:
    """The page."""
    st.title("Arms")
    st.caption(
        "Each arm against the control (default: the arm whose run.json has every toggle off): "
        "its bubble reduction with the bootstrap interval over steps of that pair."
    )
    store = current_store()
    entries = runs(store)
    stop_without_runs(entries)
    arms = _pick_arms(store, entries)
    if len(arms) < 2:
        stop("Choose at least two arms: a control and a run to judge against it.")
    if urlstate.wanted("control") not in {None, *(a.run_id for a in arms)}:
        st.session_state["control"] = control_among(arms)  # the control is one of the arms
    control = pick_run("Control", "control", arms, lambda: control_among(arms))
    loaded = {arm.run_id: item for arm, item in zip(arms, loaded_runs(store, arms), strict=True)}
    for run_id, item in loaded.items():
        if item.error is not None:
            st.error(f"Cannot analyze {code(run_id)}: {esc(item.error)}")
    base = loaded[control.run_id].analysis
    if base is None:
        st.stop()
    tests: list[tuple[RunEntry, Comparison]] = []
    for arm in arms:
        analysis = loaded[arm.run_id].analysis
        if arm.run_id != control.run_id and analysis is not None:
            key = (str(store), (control.run_id, control.signature), (arm.run_id, arm.signature))
            tests.append((arm, comparison(*key, (base, analysis))))
    if not tests:
        stop("No other arm could be analyzed.")
    frame = arms_frame(control, tests)
    chart(arm_reductions(frame), "arm_reductions")
    table(
        frame,
        column_config={
            "bubble_ms": st.column_config.NumberColumn("bubble / step (ms)", format="%.2f"),
            "step_time_ms": st.column_config.NumberColumn("step time p50 (ms)", format="%.2f"),
            "reduction": PERCENT,
            "ci_lo": st.column_config.NumberColumn("CI low", format="percent"),
            "ci_hi": st.column_config.NumberColumn("CI high", format="percent"),
            "confidence": None,
            **{c: PERCENT for c in frame.columns if c.endswith("_reduction")},
        },
    )
    for arm, comp in tests:
        for warning in comp.warnings:
            st.warning(f"{code(arm.run_id)}: {esc(warning)}")


render()
