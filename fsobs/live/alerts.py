"""Alert rules from evidence: the run's own earlier windows and its recent steps.

CONTRACT (filled in by the alerts work): ``evaluate(windows, recent, config)`` returns one
:class:`~fsobs.live.model.Alert` per rule, firing or not, in :data:`RULES` order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from fsobs.live.model import Alert, WindowEntry

RULES = ("bubble_ratio_up", "straggler_wait_up", "late_rank", "gc_storm", "window_missing")


@dataclass(kw_only=True, frozen=True)
class AlertConfig:
    """Thresholds of the rules (``fsobs watch --alert-*`` flags)."""

    threshold: float = 1.5
    """A window's bubble ratio (straggler wait) fires at this many times the median of the
    run's earlier closed windows."""
    min_windows: int = 3
    """Earlier closed windows needed before a window is compared with them."""
    recent_windows: int = 3
    """Closed windows that make "recent" for ``late_rank``."""
    late_share: float = 0.6
    """``late_rank`` fires when one rank was the straggler in this share of the recent
    windows' steps with a straggler."""
    gc_share: float = 0.1
    """``gc_storm`` fires when a rank's GC pauses take this share of its recent step time."""


def evaluate(
    windows: Sequence[WindowEntry], recent: pd.DataFrame, config: AlertConfig
) -> tuple[Alert, ...]:
    """Every rule's state. ``windows``: the run's index in step order; ``recent``: the recent
    sidecar rows (columns ``rank``, ``step``, ``wall_ms``, ``est_cost``, ``gc_ms``,
    ``gc_count``, ``cpu_ms``, ``nivcsw``; NaN where a line lacks one)."""
    return tuple(Alert(name=name, firing=False, message=f"{name}: not evaluated") for name in RULES)
