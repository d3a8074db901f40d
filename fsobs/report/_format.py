"""Cells, numbers and tables of the human reports (rich)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from fsobs.report._json import plain


def cell(value: Any) -> str:
    """A table cell: ``-`` for missing, floats with 2 decimals, large ints grouped."""
    value = plain(value)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return str(value)


def number(value: float) -> str:
    """``1,234.568``; ``-`` for NaN."""
    return "-" if math.isnan(value) else f"{value:,.3f}"


def fixed(value: float | None, spec: str) -> str:
    """``value`` in format ``spec``; ``n/a`` for a missing or NaN value."""
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def percent(value: float | None) -> str:
    """``12.3%``; ``n/a`` for a missing or NaN value."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.1%}"


def time_unit(scale_ms: float) -> str:
    """The unit to print durations of about ``scale_ms`` in: ``µs`` under 1 ms (where two
    decimals of ms would print ``0.00``), else ``ms``."""
    return "µs" if 0 < scale_ms < 1 else "ms"


def duration(ms: float, unit: str) -> str:
    """``12.34 ms``, or ``12.3 µs`` in µs (``unit`` from :func:`time_unit`)."""
    return f"{ms * 1e3:,.1f} µs" if unit == "µs" else f"{ms:.2f} ms"


def short_list(values: object) -> str:
    """At most 8 values, comma-separated (`` ...`` when there are more)."""
    # a field of a pandas row (a list of ranks): pandas-stubs types it as a scalar
    items = [str(v) for v in values]  # type: ignore[attr-defined]
    return ", ".join(items[:8]) + (" ..." if len(items) > 8 else "")


def table(title: str, frame: pd.DataFrame, columns: dict[str, str]) -> Table:
    """One row per row of ``frame``: ``columns`` maps its column names to the headers."""
    out = Table(title=title, title_justify="left")
    for header in columns.values():
        out.add_column(header, justify="right")
    for row in frame.to_dict("records"):
        out.add_row(*(cell(row[c]) for c in columns))
    return out


def print_table(console: Console, rows: Table) -> None:
    """Print a table only when it has rows."""
    if rows.row_count:
        console.print(rows)
