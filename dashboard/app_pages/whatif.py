"""What-if: each optimizer toggle's predicted bubble reduction from one baseline run, next to the
measured A/Bs of that run where the store has them, and the simulated scale curve."""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from dashboard import figures
from dashboard.cache import BY_REPR, comparison, load, runs
from dashboard.numbers import ms, pct
from dashboard.scale_study import STUDY_STEPS, STUDY_WORLD_SIZE, Study, in_process
from dashboard.store import RunEntry, Signature
from dashboard.tables import has_sidecar, oracle_split
from dashboard.text import esc
from dashboard.widgets import (
    chart,
    current_store,
    open_run,
    stop_on_error,
    table,
)
from fsobs import Analysis, FsobsError
from fsobs.analysis import TOGGLES, BalanceSplit, WhatIf, available_toggles, whatif
from fsobs.simulate import WORLD_SIZES

DRAWS = (50, 200)
BALANCE_SPLITS = ("kk", "lpt", "kk-unequal", "window:2", "window:4", "window:8")
DRAWS_KEY = "draws"
# A measured A/B: the bubble reduction, its interval's ends, the test run's id (a comment: a
# bare string in a page is drawn by Streamlit's magic).
Measured = tuple[float, float, float, str]


@st.cache_resource(max_entries=16, show_spinner=False, hash_funcs=BY_REPR)
def _predict(
    store: str,
    run_id: str,
    signature: Signature,
    toggles: tuple[str, ...],
    draws: int,
    split: str,
    _analysis: Analysis,
) -> tuple[WhatIf | None, str | None]:
    bar = st.progress(0.0, text="Replaying the run with each toggle...")
    try:
        mode = BalanceSplit.parse(split)
        progress = partial(_show_progress, bar)
        return whatif(_analysis, toggles, draws=draws, balance_split=mode, progress=progress), None
    except FsobsError as exc:
        return None, str(exc).replace(f"{store}/", "")
    finally:
        bar.empty()  # a cache hit replays the bar's messages: it ends empty there too


@st.cache_resource(show_spinner=False)
def _waiters() -> ThreadPoolExecutor:
    """Threads that wait for the scale studies' processes (:mod:`dashboard.scale_study`)."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="scale-study")


@st.cache_resource(max_entries=8, show_spinner=False, hash_funcs=BY_REPR)
def _study(store: str, run_id: str, signature: Signature, _analysis: Analysis) -> Future[Study]:
    """:func:`dashboard.scale_study.study` of the run, started in a process of its own."""
    return _waiters().submit(in_process, _analysis)


def _measured(entry: RunEntry, analysis: Analysis) -> dict[tuple[str, ...], Measured]:
    """Toggles applied -> (reduction, lo, hi, run id) for the runs next to this one (same
    folder, same world size) that trained the same global batches with toggles applied."""
    store = current_store()
    parent = entry.run_id.rpartition("/")[0]
    found: dict[tuple[str, ...], Measured] = {}
    for other in runs(store):
        if other.run_id == entry.run_id or other.run_id.rpartition("/")[0] != parent:
            continue
        toggles = other.meta.toggles if other.meta is not None else {}
        applied = tuple(t for t in TOGGLES if t in toggles and toggles[t].applied)
        if not applied or applied in found:
            continue
        test = load(store, other).analysis
        if test is None or test.run.world_size != analysis.run.world_size:
            continue
        c = comparison(
            str(store),
            (entry.run_id, entry.signature),
            (other.run_id, other.signature),
            (analysis, test),
        )
        if c.same_batches is not False:
            found[applied] = (c.bubble_reduction, *c.bubble_reduction_ci, other.run_id)
    return found


def _predictions(result: WhatIf, measured: dict[tuple[str, ...], Measured]) -> pd.DataFrame:
    rows = []
    for p in result.predictions:
        m = measured.get(p.toggles, (math.nan, math.nan, math.nan, ""))
        rows.append(
            {
                "label": " + ".join(p.toggles),
                "predicted": p.bubble_reduction,
                "lo": p.bubble_reduction_interval[0],
                "hi": p.bubble_reduction_interval[1],
                "predicted bubble ms/step": p.bubble_ms_per_step,
                "predicted step p50 ms": p.step_time_ms_p50,
                "measured": m[0],
                "measured_lo": m[1],
                "measured_hi": m[2],
                "measured run": m[3],
            }
        )
    return pd.DataFrame(rows)


def _replay_section(result: WhatIf) -> None:
    rep = result.replay
    columns = st.columns(4)
    columns[0].metric(
        "Replay: step time error (median)",
        pct(rep.step_time_median, 2),
        help="The unchanged replay's step time against the measured one, median over steps.",
    )
    columns[1].metric("Replay: step time error (p90)", pct(rep.step_time_p90, 2))
    columns[2].metric(
        "Replay: class error (p90)",
        pct(rep.classes_p90, 2),
        help="Each class's replay error as a share of the step time, 90th percentile.",
    )
    columns[3].metric("Replay check", "passed" if rep.passed else "FAILED")
    if not rep.passed:
        st.warning("The replay does not reproduce this run: the predictions are unreliable.")


def _oracle_section(result: WhatIf) -> None:
    o = result.oracle
    st.subheader("Oracle: equal compute on every rank in every step")
    columns = st.columns(4)
    columns[0].metric(
        "Bubble reduction (predicted)",
        pct(o.bubble_reduction),
        help="Against the unchanged replay, every rank given the step's mean busy time.",
    )
    columns[1].metric("Straggler wait left", ms(o.by_class["straggler_wait"]))
    split = oracle_split(o.straggler_wait_ms_per_step, o.data_share)
    if split is not None and o.data_share is not None:
        data, noise = split
        columns[2].metric(
            "Of the wait: from the data",
            ms(data),
            help="The replayed straggler wait times the data's share (below).",
        )
        columns[3].metric("Of the wait: from the noise", ms(noise))
        st.caption(
            f"The replayed straggler wait, {ms(o.straggler_wait_ms_per_step)} per rank and "
            f"step, split by the data's share of the two counterfactual waits: "
            f"{pct(o.data_share, 0)} (data's share of the counterfactuals). Replayed with only "
            f"the data differing between the ranks the wait would be "
            f"{ms(o.wait_from_data_ms_per_step)}, with only the noise (rank speed, machine) "
            f"{ms(o.wait_from_noise_ms_per_step)}; waits do not add up, so the two "
            "counterfactuals are not the split. No split of the samples removes the noise's part."
        )


def _scale_section(entry: RunEntry, analysis: Analysis) -> None:
    """The study :func:`render` started before the predictions, once it is done."""
    st.subheader("At scale (simulated)")
    st.badge("simulated", icon=":material/science:", color="orange")
    running = _study(str(current_store()), entry.run_id, entry.signature, analysis)
    with st.spinner(f"Simulating {WORLD_SIZES[0]} to {WORLD_SIZES[-1]} ranks..."):
        try:
            curve, at_scale, source = running.result()
        except RuntimeError as exc:  # the next visit tries again
            _study.clear()
            st.error(esc(f"No scale study: {exc}"))
            return
    st.caption(
        f"fsobs.simulate, {STUDY_STEPS} steps per point; job: {source}. BENCHMARKS.md states "
        "every assumption (communication, noise and length models)."
    )
    chart(figures.scale_curve(curve), "scale_curve")
    chart(figures.toggles_at_scale(at_scale, STUDY_WORLD_SIZE), "toggles_at_scale")


def _show_progress(bar: DeltaGenerator, done: int, total: int, what: str) -> None:
    """What-if's stages on the progress bar (:data:`fsobs.analysis.whatif.predict.Progress`)."""
    text = f"Predicting: {what}..." if what else "Drawing the predictions..."
    bar.progress(done / total, text=f"{text} (stage {min(done + 1, total)} of {total})")


def _draws_selector(slot: DeltaGenerator, used: int | None) -> None:
    """The noise-draws selector; a choice a big run cannot afford shows the draws it gets
    (``whatif`` caps them by the replay's size), so selector and caption name one number."""

    def label(draws: int) -> str:
        return str(draws) if used is None or draws <= used else f"{used} (of {draws}: capped)"

    slot.selectbox("Noise draws", DRAWS, key=DRAWS_KEY, format_func=label)


def render() -> None:
    """The page."""
    st.title("What-if")
    entry, analysis = open_run("Baseline run", want=has_sidecar)
    possible = available_toggles(analysis)
    left, middle, right = st.columns([3, 1, 1])
    chosen = left.multiselect("Toggles (every combination is predicted)", possible, possible)
    split = middle.selectbox("Balance mode", BALANCE_SPLITS, key="balance_split")
    split = split or BALANCE_SPLITS[0]  # a selectbox with a default never gives None
    slot = right.empty()  # the draws selector, drawn once the run's cap on draws is known
    draws = st.session_state.get(DRAWS_KEY, DRAWS[0])
    if not chosen:
        st.info("Choose at least one toggle.")
        st.stop()
    toggles = tuple(t for t in TOGGLES if t in chosen)
    store = str(current_store())
    _study(store, entry.run_id, entry.signature, analysis)  # simulates while the page predicts
    result, error = _predict(store, entry.run_id, entry.signature, toggles, draws, split, analysis)
    _draws_selector(slot, result.draws if result is not None else None)
    if result is None:
        stop_on_error(error or "unknown error", "No prediction")
    st.caption(
        "Every number below is a **prediction** from this run alone: its segment graph replayed "
        f"with the toggles applied ({result.draws} draws of the residual noise, steps "
        f"resampled; {result.confidence:.0%} intervals). Measured A/Bs come from runs next to "
        "this one that trained the same batches."
    )
    _replay_section(result)
    frame = _predictions(result, _measured(entry, analysis))
    chart(figures.whatif_reductions(frame), "whatif_reductions")
    table(
        frame.drop(columns=["lo", "hi", "measured_lo", "measured_hi"]),
        column_config={
            "predicted": st.column_config.NumberColumn("predicted reduction", format="percent"),
            "measured": st.column_config.NumberColumn("measured reduction", format="percent"),
            "predicted bubble ms/step": st.column_config.NumberColumn(format="%.3f ms"),
            "predicted step p50 ms": st.column_config.NumberColumn(format="%.3f ms"),
        },
    )
    for note in result.notes:
        st.info(esc(note))
    _oracle_section(result)
    _scale_section(entry, analysis)


render()
