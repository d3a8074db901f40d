"""Values made strict-JSON-safe, for the ``--json`` objects of :mod:`fsobs.report`."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def plain(value: Any) -> Any:
    """numpy scalars -> Python; NaN / inf -> None (JSON has neither)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def clean(value: Any) -> Any:
    """:func:`plain` all the way down: dict keys become strings, tuples lists."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return plain(value)


def records(frame: pd.DataFrame, columns: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The rows of ``frame`` (only ``columns``, if given) as plain dicts."""
    frame = frame[list(columns)] if columns else frame
    return [{str(k): plain(v) for k, v in row.items()} for row in frame.to_dict("records")]
