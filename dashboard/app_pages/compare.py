"""Compare: a test run against a control run (bubble reduction, docs/design.md §5)."""

from __future__ import annotations

import functools
import math

import streamlit as st

from dashboard import figures, numbers
from dashboard.arms import kpi
from dashboard.cache import (
    Loaded,
    comparison,
    first_with_data,
    is_cheap,
    load,
    runs,
    trace_diff,
)
from dashboard.pending import loaded_runs
from dashboard.store import (
    RunEntry,
    Signature,
    applied_toggles,
    every_toggle_off,
    find_run,
    parent_of,
)
from dashboard.tables import column_label, has_data
from dashboard.text import code, esc
from dashboard.tracediff import change_counts
from dashboard.widgets import (
    KPI_LABELS,
    chart,
    current_store,
    default_control,
    pick_run,
    stop_without_runs,
    table,
)
from fsobs.analysis import EMBEDDING_TOTAL, Comparison
from fsobs.report import EMBEDDING_TOTAL_NOTE, toggles_line
from fsobs.storage import Location

HEADLINE = (
    ("bubble_ratio", "Bubble ratio", numbers.pct, numbers.points),
    ("bubble_ms_per_step", "Bubble / step", numbers.ms, numbers.signed_ms),
    ("step_time_ms_p50", "Step time p50", numbers.ms, numbers.signed_ms),
)  # (KPI, label, value format, delta format): a ratio's delta in percentage points


def _headline(comp: Comparison) -> None:
    """The answer first: the verdict in words, the bubble reduction with its interval and the
    headline KPIs of the test with their deltas; every KPI folded below."""
    _verdict(comp)
    columns = st.columns(len(HEADLINE) + 1)
    lo, hi = comp.bubble_reduction_ci
    columns[0].metric(
        "Bubble reduction",
        numbers.pct(comp.bubble_reduction),
        help=f"{comp.confidence:.0%} bootstrap interval over steps",
        border=True,
    )
    columns[0].caption(f"{comp.confidence:.0%} CI: {numbers.pct(lo)} to {numbers.pct(hi)}")
    for column, (key, label, value_fmt, delta_fmt) in zip(columns[1:], HEADLINE, strict=True):
        column.metric(
            label,
            value_fmt(kpi(comp, key, "test")),
            delta=delta_fmt(kpi(comp, key, "delta")),
            delta_color="inverse",
            help=numbers.KPI_HELP[key],
        )
    with st.expander("Every KPI: control, test, delta"):
        table(
            comp.kpis.rename(index=lambda k: KPI_LABELS.get(k, column_label(k))).reset_index(),
            column_config={"kpi": "KPI"},
        )


def _verdict(comp: Comparison) -> None:
    """Whether the test removed bubble, in words: its interval above 0 (a reduction), below 0
    (more bubble), or across 0 (no clear change)."""
    reduction = comp.bubble_reduction
    lo, hi = comp.bubble_reduction_ci
    ci = f"{comp.confidence:.0%} CI {numbers.pct(lo)} to {numbers.pct(hi)}, bootstrap over steps"
    if comp.not_comparable:
        st.warning(
            f"**Not comparable**: {esc(comp.not_comparable)}. The bubble reduction below "
            f"({numbers.pct(reduction)}) is shown for what it is, with no verdict."
        )
    elif math.isnan(lo) or math.isnan(hi):
        st.info(
            f"**Bubble reduction {numbers.pct(reduction)}**: too few steps for an interval, "
            "so no verdict."
        )
    elif lo > 0:
        st.success(
            f"**The test removes {numbers.pct(reduction)} of the control's bubble** ({ci}): "
            "a reduction beyond the step-to-step noise."
        )
    elif hi < 0:
        st.error(
            f"**The test has {numbers.pct(-reduction)} more bubble than the control** ({ci}): "
            "it made things worse."
        )
    else:
        st.warning(
            f"**No clear change**: a bubble reduction of {numbers.pct(reduction)}, but its {ci} "
            "includes 0."
        )


def _warnings(comp: Comparison) -> None:
    for warning in comp.warnings:
        st.warning(esc(warning))
    if comp.same_batches:
        st.success("Both runs trained on the same global batches.")
    for role, toggles in (("Control", comp.control_toggles), ("Test", comp.test_toggles)):
        st.caption(f"{role} toggles: {esc(toggles_line(toggles))}")


def _deltas(comp: Comparison, control: Loaded, test: Loaded) -> None:
    chart(
        figures.bubble_reduction(
            comp.bubble_reduction, comp.bubble_reduction_ci, comp.by_class, comp.by_class_ci
        ),
        "reduction",
    )
    assert control.analysis is not None and test.analysis is not None
    chart(figures.class_means(control.analysis.steps, test.analysis.steps), "class_means")
    _roles(comp)
    chart(figures.per_rank_delta(comp.per_rank), "per_rank")
    with st.expander("Per-rank table (ms per step)"):
        table(comp.per_rank)
    chart(figures.step_time_distribution(comp.step_times), "step_times")


def _roles(comp: Comparison) -> None:
    """Straggler wait and exposed communication by the role of the collective (embedding,
    dense, other), with their reductions: what the priority-overlap toggle acts on."""
    shown = comp.by_role[(comp.by_role["control"] > 0) | (comp.by_role["test"] > 0)]
    st.subheader("Communication by role (ms per rank and step)")
    if shown.empty:
        st.info("Neither run spent time in a matched collective.")
        return
    table(
        shown,
        column_config={
            "reduction": st.column_config.NumberColumn(format="percent"),
            "ci_lo": st.column_config.NumberColumn("CI low", format="percent"),
            "ci_hi": st.column_config.NumberColumn("CI high", format="percent"),
        },
    )
    if (comp.by_role["role"] == EMBEDDING_TOTAL).any():
        st.caption(EMBEDDING_TOTAL_NOTE)


def _first_rank_file(loaded: Loaded) -> tuple[str, int, Signature]:
    assert loaded.analysis is not None
    run = loaded.analysis.run
    rank = run.rank_ids[0]
    return (str(loaded.entry.path / run[rank].path.name), rank, loaded.entry.signature)


def _op_diff(control: Loaded, test: Loaded) -> None:
    st.subheader("Op diff (HTA TraceDiff)")
    assert control.analysis is not None and test.analysis is not None
    gpu = control.analysis.run.device == "gpu" and test.analysis.run.device == "gpu"
    if not gpu:
        st.info(
            "HTA's TraceDiff applies to GPU traces only; for these runs the same table is "
            "computed by fsobs from its own events."
        )
    if not st.checkbox("Compute the op diff (HTA parsing takes a while)", key="op_diff"):
        return
    diff = trace_diff(_first_rank_file(control), _first_rank_file(test), use_hta=gpu)
    st.caption(f"Source: {esc(diff.source)}; {esc(diff.note)}.")
    columns = st.columns(5)
    for column, (kind, count) in zip(columns, change_counts(diff.table).items(), strict=True):
        column.metric(f"ops {kind}", count)
    if not diff.table.empty:
        chart(figures.op_diff_top(diff.table), "op_diff_chart")
    table(diff.table.reset_index())


def _default_pair(store: Location, entries: list[RunEntry]) -> tuple[str, str]:
    """The control has every toggle off (:func:`dashboard.widgets.default_control`) and the
    test is the run of its folder with the most toggles applied (else of the store). Without
    such a control: a ``<dir>/control`` + ``<dir>/test`` pair with data, else the first two runs
    with data."""
    control = default_control(store, entries)
    entry = find_run(entries, control)
    if entry is not None and every_toggle_off(entry.meta):
        test = _most_toggles(store, entries, control)
        if test is not None:
            return control, test
    named = _named_pair(store, entries)
    if named is not None:
        return named
    return control, first_with_data(store, entries, skip=control)


def _most_toggles(store: Location, entries: list[RunEntry], control: str) -> str | None:
    """The cheap run with data and applied toggles that is most like a test of ``control``:
    in its folder first, then with the most toggles applied, then by id."""
    folder = parent_of(control)
    candidates = [
        e for e in entries if e.run_id != control and applied_toggles(e.meta) and is_cheap(store, e)
    ]
    candidates.sort(key=lambda e: (parent_of(e.run_id) != folder, -len(applied_toggles(e.meta))))
    return next((e.run_id for e in candidates if has_data(load(store, e).analysis)), None)


def _named_pair(store: Location, entries: list[RunEntry]) -> tuple[str, str] | None:
    """A ``<dir>/control`` + ``<dir>/test`` pair whose runs both have data."""
    ids = {e.run_id for e in entries}
    for entry in entries:
        parent, _, leaf = entry.run_id.rpartition("/")
        sibling = f"{parent}/test" if parent else "test"
        if leaf == "control" and sibling in ids:
            pair = (entry, find_run(entries, sibling))
            if all(
                p is not None and is_cheap(store, p) and has_data(load(store, p).analysis)
                for p in pair
            ):
                return entry.run_id, sibling
    return None


def _other(pair: tuple[str, str], control: str) -> str:
    """The default test: the pair's, unless the control chosen is that run."""
    return pair[0] if pair[1] == control else pair[1]


def render() -> None:
    """The page."""
    st.title("Compare")
    store = current_store()
    entries = runs(store)
    stop_without_runs(entries)
    pair = functools.cache(
        functools.partial(_default_pair, store, entries)
    )  # only if the URL has none
    left, right = st.columns(2)
    with left:
        control = pick_run("Control", "control", entries, lambda: pair()[0])
    with right:
        test = pick_run("Test", "test", entries, lambda: _other(pair(), control.run_id))
    first, second = loaded_runs(store, [control, test])
    loaded = (first, second)
    for role, item in zip(("control", "test"), loaded, strict=True):
        if item.error is not None:
            st.error(f"Cannot analyze the {role} run {code(item.entry.run_id)}: {esc(item.error)}")
    if loaded[0].analysis is None or loaded[1].analysis is None:
        st.stop()
    if control.run_id == test.run_id:
        st.info("Control and test are the same run: pick two different runs.")
    key = str(store)
    comp = comparison(
        key,
        (control.run_id, control.signature),
        (test.run_id, test.signature),
        (loaded[0].analysis, loaded[1].analysis),
    )
    _headline(comp)
    _warnings(comp)
    _deltas(comp, *loaded)
    _op_diff(*loaded)


render()
