"""Streamlit pieces shared by the pages: the store, run pickers, run header, KPIs, charts."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import numbers, urlstate
from dashboard.cache import UNFINISHED, first_with_data, runs
from dashboard.figures import title_in_template
from dashboard.pending import loaded_runs
from dashboard.store import (
    RunEntry,
    every_toggle_off,
    find_run,
    resolve_store,
    toggles_table,
)
from dashboard.tables import column_label, has_data
from dashboard.text import code, esc
from fsobs import Analysis
from fsobs.runformat import RunMeta
from fsobs.storage import Location, as_location

STORE_KEY = "fsobs_store"
KPIS = (
    ("bubble_ratio", "Bubble ratio", "pct"),
    ("bubble_ms_per_step", "Bubble / step", "ms"),
    ("straggler_wait_ms_per_step", "Straggler wait / step", "ms"),
    ("exposed_comm_ms_per_step", "Exposed comm / step", "ms"),
    ("unattributed_comm_ms_per_step", "Unattributed comm / step", "ms"),
    ("host_idle_ms_per_step", "Host idle / step", "ms"),
    ("other_ms_per_step", "Other / step", "ms"),
    ("step_time_ms_p50", "Step time p50", "ms"),
    ("step_time_ms_p90", "Step time p90", "ms"),
    ("contention_ms_per_step", "Contention / step (beside)", "ms"),
    ("clock_skew_ms", "Clock skew", "ms"),
)
"""(summary key, label, unit) of the KPIs shown, in order."""
KPI_LABELS = {key: label for key, label, _ in KPIS}


def init_store() -> Location:
    """Resolve the store once per rerun (``--store`` after ``--``, ``FSOBS_STORE``, ``traces``)."""
    store = resolve_store(sys.argv[1:], os.environ)
    st.session_state[STORE_KEY] = str(store)
    return store


def current_store() -> Location:
    """The store resolved by the entry script: a local folder, or a URL (read-only)."""
    return as_location(st.session_state.get(STORE_KEY) or init_store())


def format_kpi(value: float, unit: str) -> str:
    """``61.0%``, ``2.04 ms`` or ``n/a`` (:mod:`dashboard.numbers`)."""
    return numbers.pct(value) if unit == "pct" else numbers.ms(value)


def stop_without_runs(entries: Sequence[RunEntry]) -> None:
    """Say that the store is empty and end the page."""
    if not entries:
        st.info(f"No run in the store ({code(current_store())}). Upload one on the Runs page.")
        st.page_link("app_pages/runs.py", label="Go to Runs")
        st.stop()


def pick_run(
    label: str, key: str, entries: Sequence[RunEntry], default: Callable[[], str]
) -> RunEntry:
    """A run selectbox whose choice is the ``key`` query parameter (``/bubbles?run=<id>``).

    The run is the one the user just picked, else the URL's, else the session's last one
    (:func:`dashboard.urlstate.wanted`); ``default()`` is called only when none names one
    (finding a default may analyze runs). An id of the URL the store does not have ends the page
    with one line saying so. Ids are only matched against the store's runs, never opened as paths.
    """
    ids = [e.run_id for e in entries]
    chosen = urlstate.wanted(key)
    if chosen is not None and chosen not in ids:
        if urlstate.in_url(key, chosen):
            stop_unknown(key, [chosen])
        chosen = None  # remembered, deleted since
    st.session_state[key] = chosen or default()
    choice = st.selectbox(label, ids, key=key)
    assert choice is not None  # the store has runs (stop_without_runs), one is chosen
    urlstate.keep(key, choice)
    entry = find_run(entries, choice)
    assert entry is not None  # the options are the store's ids
    return entry


def stop_unknown(key: str, run_ids: Sequence[str]) -> NoReturn:
    """Say that the URL names runs the store does not have, and end the page."""
    names = ", ".join(code(r) for r in run_ids)
    st.error(f"No run {names} in the store ({key}= in the URL).")
    st.page_link("app_pages/runs.py", label="See the stored runs")
    st.stop()


def default_control(store: Location, entries: Sequence[RunEntry]) -> str:
    """The control a comparison opens on: the first run with data whose ``run.json`` has every
    toggle off (:func:`dashboard.store.every_toggle_off`), else the first run with data."""
    return first_with_data(store, entries, want=_baseline)


def _baseline(analysis: Analysis | None) -> bool:
    return analysis is not None and has_data(analysis) and every_toggle_off(analysis.run.meta)


def open_run(
    label: str, want: Callable[[Analysis | None], bool] | None = None
) -> tuple[RunEntry, Analysis]:
    """The page's run: the ``run`` picker (default: the first run satisfying ``want``, see
    :func:`dashboard.cache.first_with_data`), analyzed, with its header; the page ends with the
    loader's message when the run cannot be analyzed, or when the store is empty."""
    store = current_store()
    entries = runs(store)
    stop_without_runs(entries)
    wanted = has_data if want is None else want
    entry = pick_run(label, "run", entries, lambda: first_with_data(store, entries, want=wanted))
    if entry.unfinished:
        st.info(f"{code(entry.run_id)} is a live run, not finished: {UNFINISHED}.")
        st.page_link("app_pages/live.py", label="Open it live", query_params={"run": entry.run_id})
        st.stop()
    (loaded,) = loaded_runs(store, [entry])
    if loaded.analysis is None:
        stop_on_error(loaded.error or "unknown error", f"Cannot analyze {code(entry.run_id)}")
    run_header(entry, loaded.analysis)
    return entry, loaded.analysis


def stop_on_error(error: str, what: str) -> NoReturn:
    """Show the one-line reason a run could not be analyzed and end the page (``what`` is
    Markdown, ``error`` text)."""
    st.error(f"{what}: {esc(error)}")
    st.stop()


def run_header(entry: RunEntry, analysis: Analysis) -> None:
    """Facts, badges (simulated, incomplete), toggles requested/applied, loader warnings."""
    run = analysis.run
    meta = run.meta
    if meta is not None and meta.simulated:
        st.badge("simulated", icon=":material/science:", color="orange")
        st.caption("This run was produced by the simulator (fsobs.simulate), not measured.")
    hosts = sorted({r.host_name for r in run.ranks.values() if r.host_name})
    st.caption(
        f"{code(entry.run_id)} · {run.device.upper()} · world size {run.world_size} · "
        f"{len(run.ranks)} rank(s) loaded · {len(run.steps)} step(s) · "
        f"hosts: {esc(', '.join(hosts) or 'unknown')}"
    )
    if meta is not None and meta.status == "incomplete":
        st.warning(f"Incomplete run: {esc(meta.reason or 'some ranks are missing')}")
    _toggles(meta)
    for warning in run.warnings[:5]:
        st.warning(esc(warning))
    if len(run.warnings) > 5:
        st.caption(f"... and {len(run.warnings) - 5} more warning(s)")


def _toggles(meta: RunMeta | None) -> None:
    rows = toggles_table(meta)
    if not rows:
        return
    for row in rows:
        if row["requested"] and not row["applied"]:
            reason = row["reason"] or "no reason recorded"
            st.info(f"{code(row['toggle'])} was requested but not applied: {esc(reason)}")
    with st.expander("Optimizer toggles (requested / applied)"):
        table(pd.DataFrame(rows))


def kpi_metrics(summary: dict[str, float], skip: Sequence[str] = ()) -> None:
    """The KPIs of ``Analysis.summary`` as metrics, five per row, but those in ``skip`` (shown
    elsewhere on the page)."""
    kpis = [kpi for kpi in KPIS if kpi[0] not in skip]
    for start in range(0, len(kpis), 5):
        row = kpis[start : start + 5]
        for column, (key, label, unit) in zip(st.columns(5)[: len(row)], row, strict=True):
            column.metric(
                label, format_kpi(summary.get(key, math.nan), unit), help=numbers.KPI_HELP[key]
            )


MISSING = "—"
"""What a table shows for a missing value (Streamlit's own placeholder is "None")."""


def table(
    frame: pd.DataFrame, *, column_config: dict[str, Any] | None = None, key: str | None = None
) -> None:
    """A DataFrame as every table of the dashboard is shown: numbers without float noise
    (:func:`dashboard.numbers.tidy`), each column under words (its ``column_config`` label,
    else :func:`dashboard.tables.column_label`), a missing value as :data:`MISSING`, no index
    (a frame whose index says something resets it into a column first)."""
    config: dict[str, Any] = dict(column_config or {})
    for name in map(str, frame.columns):
        given = config.get(name)
        if isinstance(given, dict):
            config[name] = given | {"label": given.get("label") or column_label(name)}
        elif name not in config:
            config[name] = column_label(name)
    st.dataframe(
        numbers.tidy(frame),
        hide_index=True,
        column_config=config,
        placeholder=MISSING,
        key=key,
    )


def chart(fig: go.Figure, key: str) -> None:
    """A Plotly chart at full width, its title bold once
    (:func:`dashboard.figures.title_in_template`)."""
    st.plotly_chart(title_in_template(fig), key=key, width="stretch")


def stop(message: str) -> NoReturn:
    """Show an info line (the page's Markdown) and end the page."""
    st.info(message)
    st.stop()
