"""Bubbles: where one run's step time goes (DESIGN §5), rank by rank and step by step."""

from __future__ import annotations

import math
from functools import partial

import streamlit as st

from dashboard import figures
from dashboard.cache import findings_of
from dashboard.ranks import (
    DEFAULT_TOP_K,
    MAX_TIMELINE_RANKS,
    MODES,
    RankChoice,
    choose_ranks,
    default_mode,
)
from dashboard.store import RunEntry
from dashboard.tables import TIMELINE_PIXELS, TIMELINE_STEPS, lateness_frame, timeline_frame
from dashboard.widgets import (
    chart,
    current_store,
    kpi_metrics,
    open_run,
    stop,
)
from fsobs import Analysis
from fsobs.analysis.pipeline import EMBEDDING_TOTAL, by_role
from fsobs.analysis.stragglers.causes import CAUSES
from fsobs.analysis.stragglers.whales import run_bounds
from fsobs.report.analysis import EMBEDDING_TOTAL_NOTE

TABS = ("Step timeline", "Stragglers", "Data attribution", "HTA tables")
TAB_KEY = "bubbles_tab"
# Query parameters of the rank filter: its mode (a label of dashboard.ranks.MODES), its list.
RANKS_KEY, LIST_KEY = "ranks", "rank_list"


def _overview(entry: RunEntry, analysis: Analysis) -> None:
    for line in findings_of(str(current_store()), entry.run_id, entry.signature, analysis):
        st.markdown(f"- {line}")
    kpi_metrics(analysis.summary)
    chart(figures.bubble_classes_by_rank(analysis.steps), "bubble_classes")


def _rank_filter(analysis: Analysis, run_id: str) -> RankChoice:
    """The ranks of the heatmap and the timeline: all, the top k stragglers, a range or a list
    (``/bubbles?run=<id>&ranks=List&rank_list=0-3,8``: the mode by its label)."""
    ranks = analysis.run.rank_ids
    left, right = st.columns([2, 3], vertical_alignment="bottom")
    mode = left.segmented_control(
        "Ranks in the heatmap and the timeline",
        list(MODES),
        format_func=MODES.__getitem__,
        default=default_mode(len(ranks)),
        required=True,
        key=RANKS_KEY,
        bind="query-params",
    )
    k, span, text = DEFAULT_TOP_K, None, ""
    if mode == "top":
        k = right.number_input(
            "Stragglers (most wait caused)",
            min_value=1,
            max_value=len(ranks),
            value=min(DEFAULT_TOP_K, len(ranks)),
            key=f"rank_top:{run_id}",
        )
    elif mode == "range" and len(ranks) > 1:
        span = right.select_slider(
            "Ranks from, to",
            options=ranks,
            value=(ranks[0], ranks[min(DEFAULT_TOP_K, len(ranks)) - 1]),
            key=f"rank_range:{run_id}",
        )
    elif mode == "list":
        text = right.text_input("Ranks (e.g. 0-3, 8, 12)", key=LIST_KEY, bind="query-params")
    choice = choose_ranks(
        mode or default_mode(len(ranks)),
        ranks,
        analysis.stragglers.per_rank,
        k=k,
        span=span,
        text=text,
    )
    for problem in choice.problems:
        st.warning(f"Rank filter: {problem}")
    st.caption(f"Heatmap and timeline: {choice.label}.")
    return choice


def _timeline(analysis: Analysis, *, run_id: str, ranks: list[int]) -> None:
    steps = analysis.run.steps
    if len(steps) > 1:
        first, last = st.select_slider(
            "Steps shown",
            options=steps,
            value=(steps[0], steps[min(TIMELINE_STEPS, len(steps)) - 1]),
            key=f"timeline_steps:{run_id}",
        )
        window = [s for s in steps if first <= s <= last]
    else:
        window = steps
    drawn = ranks[:MAX_TIMELINE_RANKS]
    if len(drawn) < len(ranks):
        st.caption(
            f"The timeline draws the first {len(drawn)} of the {len(ranks)} chosen ranks; "
            "choose fewer ranks above to see the others."
        )
    bubbles = analysis.bubbles.of_ranks(drawn)
    bars = timeline_frame(bubbles, window, analysis.collectives.offsets_ns)
    chart(figures.step_timeline(bars, window, num_ranks=len(analysis.run.ranks)), "timeline")
    count = bars.attrs["num_intervals"]
    if bars.attrs["merged"]:
        capped = (
            f" A lane left with more than {bars.attrs['lane_bars']} bars keeps its widest gaps."
            if bars.attrs["capped"]
            else ""
        )
        st.caption(
            f"{count:,} intervals drawn as {len(bars):,} bars: in each lane, intervals less than "
            f"{bars.attrs['min_gap_ms']:.3g} ms apart (1/{TIMELINE_PIXELS} of the window) are "
            f"one bar, as opaque as its class fills it; hover a bar for its exact time.{capped} "
            "Choose fewer steps to see more detail. The numbers above are not affected."
        )
    else:
        st.caption(f"Every interval drawn as it is ({count:,}).")


def _stragglers(analysis: Analysis) -> None:
    strag = analysis.stragglers
    named = strag.per_step.dropna(subset=["rank"])
    if named.empty:
        st.info(
            "No step has a straggler: no collective matched across every rank of its group, "
            "or every wait was tiny (see the findings)."
        )
        _roles(analysis)  # exposed communication by role, straggler or not
        return
    who = (
        f"rank {strag.culprit} is the most frequent straggler"
        if strag.culprit is not None
        else "no single rank is the most frequent straggler"
    )
    st.markdown(f"Verdict: **{strag.verdict}** — {who}.")
    chart(figures.straggler_steps(named), "straggler_steps")
    st.dataframe(strag.per_rank, hide_index=True)
    _split_bound(analysis)
    _causes(analysis)
    _roles(analysis)


def _split_bound(analysis: Analysis) -> None:
    """The imbalance no split inside a step can beat, beside the split's (stragglers.whales)."""
    bounds = run_bounds(analysis)
    if bounds is None or bounds.per_step.empty:
        return
    s = bounds.summary()
    left, middle, right = st.columns(3)
    left.metric("Imbalance of the split (max / mean)", f"{s.imbalance:.2f}")
    best = s.whale_bound if math.isnan(s.equal_bound) else s.equal_bound
    middle.metric("No split can go below", f"{best:.2f}")
    right.metric("Steps with a whale", f"{s.num_whale_steps} of {s.num_steps}")
    st.caption(
        "A whale: one sample costlier than the mean rank load (the run's cost model, "
        f"{s.cost_source}); whichever rank trains it is late, however the step is split. "
        f"{s.num_whale_stragglers} step(s) have a straggler that trained its whale."
    )


def _causes(analysis: Analysis) -> None:
    """Why the straggler was late, per step and over the run (fsobs.analysis.stragglers.causes)."""
    st.subheader("Why the straggler was late")
    causes = analysis.causes
    if causes is None:
        st.info(
            "Unknown: the step sidecars have no GC, CPU-time and context-switch fields (runs "
            "recorded with the profiler by `fsobs run` have them)."
        )
        return
    columns = st.columns(len(CAUSES))
    for column, cause in zip(columns, CAUSES, strict=True):
        share = causes.shares[cause]
        column.metric(f"{cause} (share of the wait)", "n/a" if share != share else f"{share:.0%}")
    st.dataframe(causes.per_step, hide_index=True)


def _roles(analysis: Analysis) -> None:
    """Straggler wait and exposed communication by the role of the collective."""
    roles = by_role(analysis.roles)
    if not any(v for values in roles.values() for v in values.values() if v == v):
        return
    st.subheader("Communication by role (ms per rank and step)")
    st.dataframe([{"role": role, **values} for role, values in roles.items()], hide_index=True)
    if EMBEDDING_TOTAL in roles:
        st.caption(EMBEDDING_TOTAL_NOTE)


def _attribution(analysis: Analysis) -> None:
    attr = analysis.attribution
    if attr is None:
        st.info("No step sidecar (steps.rank<R>.jsonl): the input data cannot be checked.")
        return
    st.markdown(f"Verdict: **{attr.verdict.replace('_', ' ')}** (see the findings).")
    left, middle, right = st.columns(3)
    left.metric("Wait explained by the data", f"{attr.explained_wait_share:.0%}")
    middle.metric("Cost vs lateness (Spearman)", f"{attr.rank_correlation:.2f}")
    right.metric("Cost from", attr.cost_source)
    lateness = lateness_frame(analysis)
    if lateness is not None and not lateness.empty:
        chart(figures.data_attribution(lateness, attr.cost_source), "attribution")
    st.dataframe(attr.per_step, hide_index=True)


def _hta(analysis: Analysis) -> None:
    hta = analysis.hta
    if hta is None:
        st.info("HTA's GPU metrics do not apply: this run has no GPU events.")
        return
    st.caption("Computed by fsobs with HolisticTraceAnalysis 0.5.0's rules (same numbers).")
    chart(figures.hta_temporal_breakdown(hta.temporal_breakdown), "hta_temporal")
    st.markdown("**Temporal breakdown (µs)**")
    st.dataframe(hta.temporal_breakdown, hide_index=True)
    st.markdown("**Communication / computation overlap**")
    st.dataframe(hta.comm_comp_overlap, hide_index=True)
    st.markdown("**Idle time by stream (µs)**")
    st.dataframe(hta.idle_time_breakdown, hide_index=True)


def render() -> None:
    """The page."""
    st.title("Bubbles")
    entry, analysis = open_run("Run")
    if analysis.steps.empty:
        stop("No step was recorded on every rank (no ProfilerStep): no bubble breakdown.")
    _overview(entry, analysis)
    choice = _rank_filter(analysis, entry.run_id)
    chart(figures.straggler_wait_heatmap(analysis.steps, choice.ranks), "wait_heatmap")
    # Only the chosen tab runs (a click on another one reruns the page): the browser gets and
    # draws one tab's charts and tables, not four.
    tabs = st.tabs(TABS, key=TAB_KEY, on_change="rerun")
    timeline = partial(_timeline, run_id=entry.run_id, ranks=choice.ranks)
    sections = (timeline, _stragglers, _attribution, _hta)
    for tab, section in zip(tabs, sections, strict=True):
        if tab.open:
            with tab:
                section(analysis)


render()
