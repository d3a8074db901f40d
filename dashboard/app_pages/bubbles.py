"""Bubbles: where one run's step time goes (docs/design.md §5), rank by rank and step by step."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import figures
from dashboard.cache import BY_REPR, figure_of, findings_of, split_bounds_of, timeline_parts
from dashboard.numbers import KPI_HELP, cost_unit, ms, pct, ratio
from dashboard.ops import rank_ops, top_ops
from dashboard.ranks import (
    DEFAULT_TOP_K,
    MAX_TIMELINE_RANKS,
    MODES,
    RankChoice,
    choose_ranks,
    default_mode,
)
from dashboard.store import RunEntry, Signature
from dashboard.tables import (
    TIMELINE_PIXELS,
    TIMELINE_STEPS,
    all_to_all_frame,
    lateness_frame,
    path_frame,
)
from dashboard.text import code, esc
from dashboard.widgets import (
    KPI_LABELS,
    KPIS,
    chart,
    current_store,
    kpi_metrics,
    open_run,
    stop,
    table,
)
from fsobs import Analysis, load_rank
from fsobs.analysis import CAUSES, EMBEDDING_TOTAL, comm_locality, intra_share, kpis_by_role
from fsobs.analysis import TOGGLES as WHATIF_TOGGLES
from fsobs.export import export_rank
from fsobs.report import (
    EMBEDDING_TOTAL_NOTE,
    WHOLE_TRACE_NOTE,
    NextStep,
    applied_already,
    capture_findings,
    causes_unknown_line,
    dominant_class,
    next_step,
)

TABS = ("Step timeline", "Stragglers", "Data attribution", "All-to-all", "HTA tables")
TAB_KEY = "bubbles_tab"
# Query parameters of the rank filter: its mode (a label of dashboard.ranks.MODES), its list.
RANKS_KEY, LIST_KEY = "ranks", "rank_list"
# The timeline names its ops by default when the drawn ranks' traces are at most this big
# (naming reads them again).
NAME_OPS_BYTES = 32 * 2**20
OPEN_TRACE = "https://raw.githubusercontent.com/google/perfetto/main/tools/open_trace_in_ui"
PERFETTO = (
    "Open it at [ui.perfetto.dev](https://ui.perfetto.dev) (*Open trace file*) or in "
    "`chrome://tracing`: the rank's own events, with one process *fsobs bubbles* on top holding "
    "a track per bubble class. Locally, Perfetto's script opens it in the browser: "
    "{open_command}. Every rank at once: {export_command}."
)


def _overview(entry: RunEntry, analysis: Analysis) -> None:
    """The answer first: the bubble ratio, the dominant class, what to do about it and the
    classes per rank; the findings and the other KPIs folded below."""
    for line in capture_findings(analysis):  # the numbers below are the capture's
        st.warning(esc(line))
    dominant = dominant_class(analysis.summary)
    _answer(entry, analysis, dominant)
    classes = partial(figures.bubble_classes_by_rank, analysis.steps)
    chart(_figure(entry, "bubble_classes", (), classes), "bubble_classes")
    lines = findings_of(str(current_store()), entry.run_id, entry.signature, analysis)
    with st.expander(f"Every finding ({len(lines)})"):
        for line in lines:
            st.markdown(f"- {esc(line)}")
    shown = ("bubble_ratio",) if dominant is None else ("bubble_ratio", dominant[0])
    with st.expander(f"The other KPIs ({len(KPIS) - len(shown)})"):
        kpi_metrics(analysis.summary, skip=shown)


def _answer(entry: RunEntry, analysis: Analysis, dominant: tuple[str, float] | None) -> None:
    """The bubble ratio (with the bubble and step time), the dominant class with its share of
    the bubble, and :func:`fsobs.report.analysis.next_step` for it."""
    summary = analysis.summary
    left, right = st.columns(2)
    left.metric(
        "Bubble ratio",
        pct(summary["bubble_ratio"]),
        help=KPI_HELP["bubble_ratio"],
        border=True,
    )
    left.caption(
        f"{ms(summary['bubble_ms_per_step'])} of bubble per rank and step; step time p50 "
        f"{ms(summary['step_time_ms_p50'])}"
        + (WHOLE_TRACE_NOTE if analysis.whole_trace else "")
        + "."
    )
    if dominant is None:
        right.info("No bubble: every rank was busy through its steps.")
        return
    key, value = dominant
    right.metric(
        KPI_LABELS[key],
        ms(value),
        delta=f"{value / summary['bubble_ms_per_step']:.0%} of the bubble",
        delta_color="off",
        delta_arrow="off",
        help=KPI_HELP[key],
        border=True,
    )
    right.caption("The largest bubble class.")
    step = next_step(analysis)
    assert step is not None  # a dominant class has one
    _next_step(entry, analysis, step)


def _next_step(entry: RunEntry, analysis: Analysis, step: NextStep) -> None:
    """What to do, or that the run has that toggle on already; a link to its prediction."""
    if applied_already(analysis, step):
        st.info(
            f"**What to do:** {step.text}. This run has `{step.toggle}` applied already: what "
            "is left is in the findings below and in What-if's oracle.",
            icon=":material/check_circle:",
        )
    else:
        st.success(f"**What to do:** {step.text}.", icon=":material/lightbulb:")
    # What-if predicts its toggles from a run with step sidecars
    if step.toggle in WHATIF_TOGGLES and analysis.attribution is not None:
        st.page_link(
            "app_pages/whatif.py",
            label=f"What-if: the bubble {step.toggle} would remove from this run",
            icon=":material/arrow_forward:",
            query_params={"run": entry.run_id},
        )


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
        st.warning(f"Rank filter: {esc(problem)}")
    st.caption(f"Heatmap and timeline: {esc(choice.label)}.")
    return choice


@st.cache_resource(
    max_entries=32, show_spinner="Reading the rank's ops and kernels...", hash_funcs=BY_REPR
)
def _rank_ops(path: str, signature: Signature, rank: int, device: str) -> pd.DataFrame:
    """:func:`dashboard.ops.rank_ops` of one rank's trace (``signature``: the cache key)."""
    return rank_ops(load_rank(path), device)


def _timeline(analysis: Analysis, *, entry: RunEntry, ranks: list[int]) -> None:
    steps = analysis.run.steps
    if len(steps) > 1:
        first, last = st.select_slider(
            "Steps shown",
            options=steps,
            value=(steps[0], steps[min(TIMELINE_STEPS, len(steps)) - 1]),
            key=f"timeline_steps:{entry.run_id}",
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
    parts = timeline_parts(
        str(current_store()),
        entry.run_id,
        entry.signature,
        tuple(drawn),
        tuple(window),
        _names_ops(analysis, entry, drawn),
        analysis,
        partial(_drawn_ops, analysis, entry, drawn),
    )
    bars, ops = parts.bars, parts.ops

    def timeline() -> go.Figure:
        path = path_frame(analysis.critical_path.segments, window, bars.attrs["origin_ns"])
        return figures.step_timeline(
            bars,
            window,
            num_ranks=len(analysis.run.ranks),
            names=parts.names,
            places=parts.places,
            path=path,
        )

    choice = (tuple(drawn), tuple(window), parts.names is not None)
    chart(_figure(entry, "timeline", choice, timeline), "timeline")
    _timeline_caption(bars)
    shown = None if len(ranks) == len(analysis.run.ranks) else ranks
    over_steps = partial(figures.classes_over_steps, analysis.steps, shown)
    shown_key = () if shown is None else tuple(shown)
    chart(_figure(entry, "classes_over_steps", shown_key, over_steps), "classes_over_steps")
    if ops is not None:
        _top_ops(ops, window, len(drawn))
    _download(analysis, entry, drawn)


def _names_ops(analysis: Analysis, entry: RunEntry, drawn: list[int]) -> bool:
    """Whether the user keeps the ops of the drawn ranks named in the hover (by default when
    their traces are small, :data:`NAME_OPS_BYTES`)."""
    paths = [analysis.run[r].path for r in drawn]
    size = sum(p.stat().st_size for p in paths if isinstance(p, Path) and p.is_file())
    return st.toggle(
        "Name the ops and kernels in the hover (reads the drawn ranks' traces again, "
        f"{size / 1e6:.1f} MB)",
        value=size <= NAME_OPS_BYTES,
        key=f"timeline_names:{entry.run_id}",
    )


def _drawn_ops(analysis: Analysis, entry: RunEntry, drawn: list[int]) -> pd.DataFrame:
    """The ops and kernels of the drawn ranks (:func:`_rank_ops` of each)."""
    frames = [
        _rank_ops(str(analysis.run[rank].path), entry.signature, rank, analysis.run.device)
        for rank in drawn
    ]
    return pd.concat(frames, ignore_index=True)


def _timeline_caption(bars: pd.DataFrame) -> None:
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


def _top_ops(ops: pd.DataFrame, window: list[int], num_ranks: int) -> None:
    st.markdown(
        f"**Top ops and kernels by self time** (steps {window[0]}–{window[-1]}, "
        f"{num_ranks} rank(s) drawn)"
    )
    table(
        top_ops(ops, window),
        column_config={
            "self_ms": st.column_config.NumberColumn("self ms", format="%.3f ms"),
            "total_ms": st.column_config.NumberColumn("total ms", format="%.3f ms"),
            "self_share": st.column_config.NumberColumn("share of self time", format="percent"),
        },
    )
    st.caption(
        "Self time: an op's time minus the ops it called (on its thread); a GPU kernel's "
        "duration. *where*: its busiest streams or threads."
    )


def _download(analysis: Analysis, entry: RunEntry, drawn: list[int]) -> None:
    """One rank's trace with the bubble classes as tracks (:func:`fsobs.export.export_rank`)."""
    st.markdown("**The trace, with the bubbles drawn in it**")
    left, right = st.columns([1, 3], vertical_alignment="bottom")
    rank = left.selectbox("Rank", drawn, key=f"export_rank:{entry.run_id}")
    assert rank is not None  # the drawn ranks are never empty
    trace = analysis.run[rank]
    file = f"{entry.run_id.replace('/', '-')}-rank{rank}.trace.json.gz"
    if not isinstance(trace.path, Path):
        right.info("The export reads local runs only: this store is read-only (a URL).")
        return
    right.download_button(
        f"Download rank {rank}'s trace with bubble tracks (Perfetto, .json.gz)",
        data=partial(export_rank, trace, analysis.bubbles.of_rank(rank)),
        file_name=file,
        mime="application/gzip",
        on_click="ignore",
        key=f"export:{entry.run_id}",
    )
    st.caption(
        PERFETTO.format(
            open_command=code(f"curl -LO {OPEN_TRACE} && python3 open_trace_in_ui -i {file}"),
            export_command=code(f"fsobs export {entry.path} {file.split('-rank')[0]}-export"),
        )
    )


def _stragglers(analysis: Analysis, *, entry: RunEntry) -> None:
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
    shares = {
        c: st.column_config.NumberColumn(format="percent")
        for c in strag.per_rank.columns
        if c.endswith("_share")
    }
    table(strag.per_rank, column_config=shares)
    _split_bound(analysis, entry)
    _causes(analysis)
    _roles(analysis)


def _split_bound(analysis: Analysis, entry: RunEntry) -> None:
    """The imbalance no split inside a step can beat, beside the split's (stragglers.whales)."""
    bounds = split_bounds_of(str(current_store()), entry.run_id, entry.signature, analysis)
    if bounds is None or bounds.per_step.empty:
        return
    s = bounds.summary()
    left, middle, right = st.columns(3)
    left.metric(
        "Imbalance of the split (max / mean)",
        ratio(s.imbalance),
        help="The costliest rank's data against the mean rank's, mean over the steps (1× is even).",
    )
    best = s.whale_bound if s.equal_bound != s.equal_bound else s.equal_bound
    middle.metric(
        "No split can go below",
        ratio(best),
        help="The lowest max / mean any split of the step's samples could reach.",
    )
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
        st.info(f"Unknown: {causes_unknown_line(analysis)}.")
        return
    columns = st.columns(len(CAUSES))
    for column, cause in zip(columns, CAUSES, strict=True):
        column.metric(
            "Wait unexplained" if cause == "unexplained" else f"Wait from {cause}",
            pct(causes.shares[cause], 0),
            help=f"Share of the straggler wait that the straggler's lateness from {cause} "
            "accounts for (its lateness split into data, GC, preemption; the rest unexplained).",
        )
    table(causes.per_step)


def _roles(analysis: Analysis) -> None:
    """Straggler wait and exposed communication by the role of the collective."""
    roles = kpis_by_role(analysis.roles)
    if not any(v for values in roles.values() for v in values.values() if v == v):
        return
    st.subheader("Communication by role (ms per rank and step)")
    rows = pd.DataFrame([{"role": role, **values} for role, values in roles.items()])
    table(rows)
    if EMBEDDING_TOTAL in roles:
        st.caption(EMBEDDING_TOTAL_NOTE)


def _attribution(analysis: Analysis) -> None:
    attr = analysis.attribution
    if attr is None:
        st.info("No step sidecar (steps.rank<R>.jsonl): the input data cannot be checked.")
        return
    st.markdown(f"Verdict: **{attr.verdict.replace('_', ' ')}** (see the findings).")
    left, middle, right = st.columns(3)
    left.metric(
        "Wait in steps whose costliest rank was last",
        pct(attr.explained_wait_share, 0),
        help="Share of the straggler wait caused in steps where the rank with the costliest "
        "data arrived last (fsobs.analysis.stragglers.attribution); the Stragglers tab's "
        "'Wait from data' splits each straggler's lateness instead, and What-if's oracle "
        "replays the run.",
    )
    middle.metric(
        "Cost vs lateness (Spearman ρ)",
        "n/a"
        if attr.rank_correlation != attr.rank_correlation
        else f"{attr.rank_correlation:+.2f}",
        help="Rank correlation of each rank's data cost and its lateness, median over steps "
        "(+1: the costliest is always the latest).",
    )
    right.metric("Cost from", attr.cost_source, help=f"Measured in {cost_unit(attr.cost_source)}.")
    lateness = lateness_frame(analysis)
    if lateness is not None and not lateness.empty:
        chart(figures.data_attribution(lateness, attr.cost_source), "attribution")
    table(attr.per_step)


def _locality(analysis: Analysis) -> None:
    """Every collective class inside one host or across hosts (by the traces' host names)."""
    frame = comm_locality(analysis)
    if frame.empty:
        return
    st.markdown("**Inside a host or across hosts** (every collective, by the traces' host names)")
    share = intra_share(frame)
    if share is not None:
        of_bytes = "" if math.isnan(share[1]) else f" and {pct(share[1])} of the bytes"
        st.caption(f"{pct(share[0])} of the collectives' rank-time{of_bytes} stayed inside a host.")
    table(frame)


def _all_to_all(analysis: Analysis, *, run_id: str) -> None:
    """Collectives inside or across hosts; the most uneven all_to_all(v) instances, and the
    rank x rank volume of a chosen one."""
    _locality(analysis)
    frame = all_to_all_frame(analysis)
    if frame.empty:
        st.info("No all_to_all(v) in this run has its message sizes recorded.")
        return
    st.markdown(
        "**The most uneven all_to_all(v) instances** (max / mean over the ranks; 1× is even)"
    )
    table(
        frame,
        column_config={
            "MB sent": st.column_config.NumberColumn(format="%.3f MB"),
            "send max/mean": st.column_config.NumberColumn(format="%.2f×"),
            "receive max/mean": st.column_config.NumberColumn(format="%.2f×"),
        },
    )
    with_matrix = frame.loc[frame["rank x rank matrix"].astype(bool), "instance"].tolist()
    if not with_matrix:
        st.info(
            "No split sizes in this trace: the rank x rank volume needs every rank's "
            "`In split size` of the instance (all_to_allv with split sizes recorded; a trace "
            "truncates a list beyond 30 entries)."
        )
        return
    instance = st.selectbox("Instance (rank x rank volume)", with_matrix, key=f"a2a:{run_id}")
    row = frame[frame["instance"] == instance].iloc[0]
    ranks, matrix = analysis.collectives.all_to_all.matrices[int(instance)]
    chart(figures.all_to_all_matrix(ranks, matrix, int(instance), int(row["step"])), "a2a_matrix")
    if "most ids (sidecar)" in frame.columns and not pd.isna(row["most ids (sidecar)"]):
        same = "is" if bool(row["top sender has most ids"]) else "is not"
        st.caption(
            f"Rank {row['most ids (sidecar)']} had the most ids in step {row['step']} (its "
            f"samples' summed lengths, from the step sidecars); it {same} the top sender "
            f"(rank {row['top sender']})."
        )


def _hta(analysis: Analysis) -> None:
    hta = analysis.hta
    if hta is None:
        st.info("HTA's GPU metrics do not apply: this run has no GPU events.")
        return
    st.caption("Computed by fsobs with HolisticTraceAnalysis 0.5.0's rules (same numbers).")
    chart(figures.hta_temporal_breakdown(hta.temporal_breakdown), "hta_temporal")
    st.markdown("**Temporal breakdown (µs)**")
    table(hta.temporal_breakdown)
    st.markdown("**Communication / computation overlap**")
    table(hta.comm_comp_overlap)
    st.markdown("**Idle time by stream (µs)**")
    table(hta.idle_time_breakdown)


def _figure(
    entry: RunEntry, name: str, choice: tuple[Any, ...], build: Callable[[], go.Figure]
) -> go.Figure:
    """One of the run's figures, built once per ``choice`` (:func:`dashboard.cache.figure_of`)."""
    return figure_of(str(current_store()), entry.run_id, entry.signature, name, choice, build)


def render() -> None:
    """The page."""
    st.title("Bubbles")
    entry, analysis = open_run("Run")
    if analysis.steps.empty:
        stop("No step was recorded on every rank (no ProfilerStep): no bubble breakdown.")
    _overview(entry, analysis)
    choice = _rank_filter(analysis, entry.run_id)
    heatmap = partial(figures.straggler_wait_heatmap, analysis.steps, choice.ranks)
    chart(_figure(entry, "wait_heatmap", tuple(choice.ranks), heatmap), "wait_heatmap")
    # Only the chosen tab runs (a click on another one reruns the page): the browser gets and
    # draws one tab's charts and tables, not four.
    tabs = st.tabs(TABS, key=TAB_KEY, on_change="rerun")
    timeline = partial(_timeline, entry=entry, ranks=choice.ranks)
    stragglers = partial(_stragglers, entry=entry)
    a2a = partial(_all_to_all, run_id=entry.run_id)
    sections: tuple[Callable[[Analysis], None], ...] = (
        timeline,
        stragglers,
        _attribution,
        a2a,
        _hta,
    )
    for tab, section in zip(tabs, sections, strict=True):
        if tab.open:
            with tab:
                section(analysis)


render()
