"""Optimizer: the cost model fitted on a run, and the balance plan of one logged batch."""

from __future__ import annotations

import streamlit as st

from dashboard import figures
from dashboard.balance_plan import (
    UNTRAINED,
    CostChoice,
    balance_plan,
    default_model,
    stored_cost_model,
)
from dashboard.cache import cost_fit, step_lengths
from dashboard.numbers import ms, plain, ratio
from dashboard.store import RunEntry
from dashboard.tables import degenerate_terms, has_sidecar, imbalance_steps
from dashboard.text import esc
from dashboard.widgets import (
    chart,
    current_store,
    open_run,
    stop,
    table,
)
from fsobs import Analysis
from optim import METHODS


def _fit_section(entry: RunEntry, analysis: Analysis) -> CostChoice | None:
    st.subheader("Cost model fit")
    fit, error = cost_fit(str(current_store()), entry.run_id, entry.signature, analysis)
    if fit is None:
        st.info(f"No cost model fitted: {esc(error)}")
        return None
    model = fit.model
    columns = st.columns(4)
    columns[0].metric(
        "R²", f"{fit.r2:.3f}", help="Share of the busy time's variance the fit explains."
    )
    columns[1].metric("RMSE", ms(fit.rmse_ms, 3), help="Root mean square of measured - predicted.")
    columns[2].metric("Points (rank, step)", f"{fit.n_points:,}")
    columns[3].metric("Model", "c0 + a·L + b·L²")
    st.caption(
        f"c(L) = {plain(model.c0)} + {plain(model.a)}·L + {plain(model.b)}·L² "
        "(ns of busy time per sample)"
    )
    chart(figures.cost_fit(fit.points), "cost_fit")
    if model.c0 == model.a == model.b == 0:
        st.warning("The fitted model is zero (busy time does not grow with the lengths here).")
        return None
    degenerate = degenerate_terms(model)
    if degenerate:
        st.warning(
            f"Degenerate fit: only the {degenerate} term is non-zero (the others were fitted "
            "to 0), so the model cannot tell fixed, linear and quadratic costs apart on this "
            "run; more steps or more varied lengths would."
        )
    return CostChoice(model, "fitted on this run")


def _cost_choices(entry: RunEntry, fitted: CostChoice | None) -> list[CostChoice]:
    stored, problem = stored_cost_model(entry.path)
    if problem is not None:
        st.warning(f"cost_model.json is unusable: {esc(problem)}")
    found = [c for c in (fitted, stored) if c is not None]
    return [*found, default_model()]


def _plan_section(entry: RunEntry, analysis: Analysis, choices: list[CostChoice]) -> None:
    st.subheader("Balance plan of one batch")
    sidecar = analysis.run.sidecar
    if sidecar is None or sidecar.empty:
        st.info("No step sidecar (steps.rank<R>.jsonl): no logged batch to plan.")
        return
    left, middle, right = st.columns(3)
    steps = sorted(int(s) for s in sidecar["step"].unique())
    step = left.selectbox("Step", steps, key="plan_step")
    method = middle.selectbox("Partitioner", METHODS, key="method")
    sources = [c.source for c in choices]
    source = right.selectbox("Cost model", sources, key="cost_source")
    assert step is not None and method is not None and source is not None  # non-empty options
    choice = choices[sources.index(source)]
    if choice.source == UNTRAINED:
        st.caption("Untrained default cost model: relative costs only.")
    lengths = step_lengths(str(entry.path), entry.signature, step)
    if not lengths:
        st.info(f"The sidecars of step {step} carry only length sums, no per-sample lengths.")
        return
    plan = balance_plan(lengths, choice.model, method)
    columns = st.columns(3)
    columns[0].metric("Imbalance before (max / mean)", ratio(plan.imbalance_before))
    columns[1].metric(f"Imbalance after ({method})", ratio(plan.imbalance_after))
    columns[2].metric("Samples in the batch", f"{int(plan.per_rank['samples_before'].sum()):,}")
    if not plan.equal_size:
        st.caption("The samples do not divide evenly over the ranks: unequal counts allowed.")
    unit = "relative units" if choice.source == UNTRAINED else "ns of busy time"
    chart(figures.balance_bars(plan.per_rank, unit), "balance")
    table(plan.per_rank)


def _logged_imbalance(analysis: Analysis) -> None:
    frame = imbalance_steps(analysis.run.sidecar)
    if frame is not None:
        st.subheader("Imbalance logged by the job")
        chart(figures.imbalance_over_steps(frame), "imbalance_steps")


def render() -> None:
    """The page."""
    st.title("Optimizer")
    entry, analysis = open_run("Run", want=has_sidecar)
    if analysis.run.sidecar is None:
        stop("This run has no step sidecars (steps.rank<R>.jsonl): nothing to fit or plan.")
    fitted = _fit_section(entry, analysis)
    _plan_section(entry, analysis, _cost_choices(entry, fitted))
    _logged_imbalance(analysis)


render()
