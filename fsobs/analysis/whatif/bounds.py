"""Whales: the imbalance that no split inside a step can beat, so that a straggler whose data
holds one sample costlier than the mean rank load is told apart from a bad split.

Per step with the per-sample lengths of every rank (step sidecars), the run's cost model gives
every sample's cost ``c_i``; with ``N`` ranks and total ``T``, the mean rank load is ``T / N``::

    rank 0  |== whale ===========|==|        the rank that takes the costliest sample
    rank 1  |====|===|===|                   is at least c_1 long, whatever the split:
    rank 2  |===|====|====|                  max load >= max(c_1, T/N)
    mean    |...........|  T/N

- ``imbalance``: max / mean rank load of the split the run trained on (by the cost model);
- ``whale_bound``: :func:`optim.balance.imbalance_bound` with any counts,
  ``max(c_1, T/N) / (T/N)``; above 1 (:data:`WHALE`) the step has a **whale**: its costliest
  sample alone costs more than the mean rank load, and no split can balance the step;
- ``equal_bound``: the same with equal counts per rank (the derivation is in
  :func:`~optim.balance.imbalance_bound`), NaN when the ranks' samples do not split equally;
- ``whale_rank``: the rank that trained the costliest sample; ``straggler``: the step's
  straggler (:mod:`fsobs.analysis.stragglers.identify`, NaN when none), ``straggler_has_whale``:
  the straggler trained the whale of a step that has one: its wait is the whale's, not the split's.

The cost model is the run's own: the one behind the sidecars' ``est_cost``
(:func:`fsobs.analysis.whatif.calibration.partition_model`), else the one fitted on the busy
time (:func:`fsobs.analysis.costfit.fit_points`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis.costfit import fit_points
from fsobs.analysis.pipeline import Analysis
from fsobs.analysis.whatif.calibration import partition_model, sample_lengths
from fsobs.errors import RunError
from optim.balance import CostModel, imbalance, imbalance_bound

WHALE = 1.0 + 1e-9
"""A step has a whale when ``whale_bound`` exceeds this: 1, beyond the rounding of ``T / N``."""
COLUMNS = [
    "step",
    "num_samples",
    "mean_load",
    "max_cost",
    "imbalance",
    "whale_bound",
    "equal_bound",
    "whale_rank",
    "straggler",
    "straggler_has_whale",
]


@dataclass(frozen=True, kw_only=True)
class BoundSummary:
    """The bounds over the steps that have them (means over steps)."""

    num_steps: int
    num_whale_steps: int
    """Steps whose costliest sample alone costs more than the mean rank load."""
    num_whale_stragglers: int
    """Steps whose straggler trained that sample."""
    imbalance: float
    """Of the split the run trained on."""
    whale_bound: float
    equal_bound: float
    """NaN when no step splits into equal counts."""
    max_whale_bound: float
    cost_source: str


@dataclass
class SplitBounds:
    """``per_step``: the :data:`COLUMNS` (module docstring); ``missing_steps``: steps without
    the per-sample lengths of every rank (no bound)."""

    per_step: pd.DataFrame
    missing_steps: list[int]
    cost_source: str
    """Which cost model priced the samples (see the module docstring)."""

    def summary(self) -> BoundSummary:
        """The bounds over the steps (means), for the reports."""
        ps = self.per_step
        whales = ps["whale_bound"] > WHALE
        equal = ps["equal_bound"].dropna()
        return BoundSummary(
            num_steps=len(ps),
            num_whale_steps=int(whales.sum()),
            num_whale_stragglers=int(ps["straggler_has_whale"].sum()),
            imbalance=float(ps["imbalance"].mean()) if len(ps) else math.nan,
            whale_bound=float(ps["whale_bound"].mean()) if len(ps) else math.nan,
            equal_bound=float(equal.mean()) if len(equal) else math.nan,
            max_whale_bound=float(ps["whale_bound"].max()) if len(ps) else math.nan,
            cost_source=self.cost_source,
        )


def split_bounds(
    lengths: dict[tuple[int, int], np.ndarray],
    model: CostModel,
    *,
    ranks: list[int],
    steps: list[int],
    stragglers: pd.DataFrame,
    cost_source: str,
) -> SplitBounds:
    """The bounds of every step of ``steps`` whose ``lengths`` (per (rank, step)) cover every
    rank of ``ranks``; ``stragglers``: ``Stragglers.per_step`` (step, rank)."""
    straggler = stragglers.set_index("step")["rank"] if len(stragglers) else pd.Series(dtype=float)
    rows, missing = [], []
    for step in steps:
        if any((r, step) not in lengths for r in ranks):
            missing.append(step)
            continue
        shares = [model(lengths[(r, step)]) for r in ranks]
        found = straggler.get(step, math.nan)
        late = math.nan if pd.isna(found) else float(found)  # one rank: no straggler (NA)
        rows.append(_step_row(step, shares, ranks, late))
    return SplitBounds(pd.DataFrame(rows, columns=COLUMNS), missing, cost_source)


def _step_row(
    step: int, shares: list[np.ndarray], ranks: list[int], late: float
) -> dict[str, object]:
    costs = np.concatenate(shares)
    bounds = np.cumsum([0, *(s.size for s in shares)])
    parts = [range(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    num = len(ranks)
    whale = imbalance_bound(costs, num)
    top = int(np.argmax(costs)) if costs.size else 0
    whale_rank = ranks[int(np.searchsorted(bounds, top, side="right")) - 1]
    return {
        "step": step,
        "num_samples": int(costs.size),
        "mean_load": float(costs.sum() / num),
        "max_cost": float(costs.max()) if costs.size else 0.0,
        "imbalance": imbalance(costs, parts),
        "whale_bound": whale,
        "equal_bound": (
            imbalance_bound(costs, num, equal_size=True) if costs.size % num == 0 else math.nan
        ),
        "whale_rank": whale_rank,
        "straggler": late,
        "straggler_has_whale": bool(whale > WHALE and late == whale_rank),
    }


def run_bounds(analysis: Analysis) -> SplitBounds | None:
    """:func:`split_bounds` of an analyzed run with its own cost model (module docstring); None
    without step sidecars, or when the busy-time fit that backs the model fails (fewer than
    :data:`fsobs.analysis.costfit.MIN_POINTS` (rank, step) points, or an all-zero fit)."""
    sidecar = analysis.run.sidecar
    if sidecar is None or sidecar.empty:
        return None
    try:
        fitted = fit_points(analysis.steps, sidecar, path=analysis.run.path).model
    except RunError:
        return None
    model, source = partition_model(sidecar, fitted)
    return split_bounds(
        sample_lengths(sidecar),
        model,
        ranks=analysis.run.rank_ids,
        steps=analysis.run.steps,
        stragglers=analysis.stragglers.per_step,
        cost_source=source,
    )
