"""Numbers as the dashboard writes them: every one with its unit, fractions of a fraction in
percentage points, no float noise (``-0.000000000000001``, ``105141495.3504``).

The one formatter of the pages, tables and figures (no Streamlit, no Plotly). A missing or NaN
value is ``n/a`` everywhere.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

NA = "n/a"
SIGNIFICANT = 4
"""Significant digits a table keeps (never fewer than the integer digits)."""
NOISE = 1e-9
"""Below this magnitude a table value is float noise and shows as 0."""
HOVER_NUMBER = ",.4~r"
"""Plotly (d3) format of a plain number in a hover: 4 significant digits, grouped thousands,
no SI suffix (Plotly's ``3.5B`` reads as bytes)."""
COST_UNITS = {
    "est_cost": "the job's cost-model units",
    "len_sq_sum": "Σ L², tokens²",
}
"""What the data-attribution cost is measured in, by its source."""

KPI_HELP = {
    "bubble_ratio": "Σ bubble / Σ step window over every rank and step (docs/design.md §5).",
    "bubble_ms_per_step": "Step window minus busy time, mean over ranks and steps.",
    "straggler_wait_ms_per_step": "Blocked in a collective before the last rank arrived.",
    "exposed_comm_ms_per_step": "Blocked in a collective after every rank arrived: the "
    "transfer was not hidden behind compute.",
    "unattributed_comm_ms_per_step": "Blocked in a collective that could not be matched "
    "across ranks, so its wait cannot be split into straggler wait and exposed comm.",
    "host_idle_ms_per_step": "No compute and no collective in flight (GPU: launch-bound or "
    "waiting for data; CPU: waiting for the data loader).",
    "other_ms_per_step": "What no rule above claims; should be near zero.",
    "step_time_ms_p50": "Median step window over ranks and steps.",
    "step_time_ms_p90": "90th percentile of the step windows over ranks and steps.",
    "contention_ms_per_step": "Reported beside the bubble, not inside it: extra compute time of "
    "ops that overlap communication, against the median of the same op (name and shapes) "
    "when nothing overlaps it. SM-free communication removes it.",
    "clock_skew_ms": "Largest clock offset between ranks, estimated from the end times of "
    "synchronising collectives (0 when every rank shares one host's clock).",
}
"""One line per KPI of ``Analysis.summary``: what it measures."""


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def ms(value: float | None, digits: int = 2) -> str:
    """``2.04 ms``; under 0.01 ms in µs (``3.2 µs``), where two decimals of ms would say 0."""
    if _missing(value):
        return NA
    assert value is not None
    if value != 0 and abs(value) < 0.01:
        return f"{value * 1e3:.1f} µs"
    return f"{value:,.{digits}f} ms"


def signed_ms(value: float | None) -> str:
    """``+0.12 ms`` / ``-1.50 ms``: a difference of two durations."""
    return NA if _missing(value) else f"{value:+,.2f} ms"


def pct(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: ``0.61`` -> ``61.0%``."""
    return NA if _missing(value) else f"{value:.{digits}%}"


def points(value: float | None) -> str:
    """A difference of two fractions in percentage points: ``0.012`` -> ``+1.2 pp``."""
    return NA if value is None or _missing(value) else f"{100 * value:+.1f} pp"


def ratio(value: float | None) -> str:
    """A max / mean ratio: ``1.309×`` (1× is even; three decimals, as 1.002 is not 1)."""
    return NA if _missing(value) else f"{value:.3f}×"


def plain(value: float | None, unit: str = "") -> str:
    """Four significant digits, grouped, with ``unit`` after a space: ``3,456,000,000 units``."""
    if _missing(value):
        return NA
    assert value is not None
    text = f"{tidy_value(value):,}".removesuffix(".0")
    return f"{text} {unit}".rstrip()


def tidy_value(value: float) -> float:
    """``value`` to :data:`SIGNIFICANT` significant digits (its integer digits kept), 0 when it
    is float noise."""
    return float(tidy_array(np.array([value], dtype=np.float64))[0])


def tidy_array(values: np.ndarray) -> np.ndarray:
    """:func:`tidy_value` of every element (NaN stays NaN)."""
    values = np.asarray(values, dtype=np.float64)
    size = np.abs(values)
    noise = size < NOISE
    with np.errstate(divide="ignore", invalid="ignore"):
        magnitude = np.floor(np.log10(np.where(noise | ~np.isfinite(size), 1.0, size)))
    decimals = np.clip(SIGNIFICANT - 1 - magnitude, 0, 12)
    scale = 10.0**decimals
    out = np.round(values * scale) / scale
    out[noise] = 0.0
    tidied: np.ndarray = out + 0.0  # -0.0 -> 0.0
    return tidied


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` for display, its float columns through :func:`tidy_array`."""
    out = frame.copy()
    for column in out.columns:
        if pd.api.types.is_float_dtype(out[column]):
            out[column] = tidy_array(out[column].to_numpy(dtype=np.float64))
    return out


def cost_unit(source: str) -> str:
    """The unit of a data-attribution cost from ``source`` (``est_cost``, ``len_sq_sum``)."""
    return COST_UNITS.get(source, source)
