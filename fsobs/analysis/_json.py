"""Values made strict-JSON-safe (shared by ``fsobs.report`` and ``fsobs.analysis.ab``)."""

from __future__ import annotations

import math
from typing import Any


def plain(value: Any) -> Any:
    """numpy scalars -> Python; NaN / inf -> None (JSON has neither)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
