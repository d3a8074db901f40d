"""Several runs (arms) against one control, side by side (plain functions, no Streamlit).

Each test arm is its own :func:`fsobs.analysis.comparison.ab.compare` against the control, so each
reduction has that pair's bootstrap interval over steps (docs/design.md §5); the control's
row has the runs' numbers and no reduction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from dashboard.store import RunEntry, applied_toggles, every_toggle_off
from fsobs.analysis import Comparison

CLASS_COLUMNS = ("straggler_wait", "exposed_comm", "host_idle")
"""Bubble classes whose reduction gets a column (the others are in the Compare page)."""


def control_among(arms: Sequence[RunEntry]) -> str:
    """The first arm whose ``run.json`` has every toggle off, else the first arm."""
    return next((a.run_id for a in arms if every_toggle_off(a.meta)), arms[0].run_id)


def arms_frame(control: RunEntry, tests: Sequence[tuple[RunEntry, Comparison]]) -> pd.DataFrame:
    """One row per arm, the control first: ``arm, role, toggles`` (applied), ``bubble_ms``
    (per step), ``step_time_ms`` (p50), ``reduction``, ``ci_lo``, ``ci_hi``, ``confidence``,
    ``<class>_reduction`` for :data:`CLASS_COLUMNS`, ``same_batches`` (True / False / None).
    Reductions are fractions; the control's are NaN. ``tests`` must not be empty."""
    if not tests:
        raise ValueError("tests: need at least one arm besides the control")
    first = tests[0][1]
    rows = [_row(control, "control", first, "control")]
    rows += [_row(entry, "test", comp, "test") for entry, comp in tests]
    return pd.DataFrame(rows)


def kpi(comp: Comparison, name: str, column: str) -> float:
    """One KPI of the comparison's table (``column``: control, test, delta, ...)."""
    return float(comp.kpis[column].astype(float)[name])


def _row(entry: RunEntry, role: str, comp: Comparison, column: str) -> dict[str, object]:
    test = role == "test"
    lo, hi = comp.bubble_reduction_ci if test else (math.nan, math.nan)
    row: dict[str, object] = {
        "arm": entry.run_id,
        "role": role,
        "toggles": ", ".join(applied_toggles(entry.meta)) or "none",
        "bubble_ms": kpi(comp, "bubble_ms_per_step", column),
        "step_time_ms": kpi(comp, "step_time_ms_p50", column),
        "reduction": comp.bubble_reduction if test else math.nan,
        "ci_lo": lo,
        "ci_hi": hi,
        "confidence": comp.confidence,
    }
    for name in CLASS_COLUMNS:
        row[f"{name}_reduction"] = comp.by_class[name] if test else math.nan
    row["same_batches"] = comp.same_batches if test else None
    return row
