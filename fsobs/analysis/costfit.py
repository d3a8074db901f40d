"""Fit the per-sample cost model of :class:`optim.balance.CostModel` from a measured run.

Each (rank, step) with both a step-sidecar row and a bubble-table row is one point. A rank that
trains ``n`` samples of lengths ``L_i`` in a step is busy (``busy_ms`` of
:func:`fsobs.analysis.bubbles.tables.bubble_table`) for the sum of their costs::

    busy_ns(r, s) = Σ_i c(L_i) = c0 · n + a · ΣL + b · ΣL²,     c(L) = c0 + a·L + b·L²

so the coefficients are a linear least-squares fit on the sidecar's ``num_samples``,
``len_sum`` and ``len_sq_sum``, constrained to ``c0, a, b >= 0`` (the partitioners need
non-negative costs). Units: the model's cost is **nanoseconds of busy time per sample**.

Every point is kept, including a first traced step that may carry warm-up time; ``points``
holds each one's prediction so that outliers can be seen. At least ``MIN_POINTS`` are required,
and a fit whose coefficients are all zero (busy time that never grows with the samples, e.g.
none recorded, or recorded only on the ranks without samples) is refused: it explains nothing.

A fit with ``R² < LOW_R2`` explains little of the busy time: the model's compute does not
follow the samples' lengths (a padded model costs the padded length whatever the sample's, so
balancing by length cannot help it), or noise swamps it. :attr:`CostFit.warning` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis.pipeline import Analysis
from fsobs.errors import RunError
from fsobs.storage import Location
from optim.balance import CostModel

FEATURES = ("num_samples", "len_sum", "len_sq_sum")
"""Sidecar columns multiplying ``c0``, ``a`` and ``b``."""
MIN_POINTS = 4
LOW_R2 = 0.3
"""Below this R² (or without one) a fit explains too little to balance by
(:attr:`CostFit.warning`)."""


@dataclass
class CostFit:
    """A fitted cost model and how well it explains the measured busy time."""

    model: CostModel
    """Coefficients in ns of busy time per sample (``ids`` stays 0)."""
    r2: float
    """``1 - SS_res / SS_tot`` of the busy time per (rank, step); NaN when it never varies."""
    rmse_ms: float
    """``sqrt(mean((measured - predicted)²))`` in ms."""
    n_points: int
    points: pd.DataFrame
    """``rank, step, num_samples, len_sum, len_sq_sum, measured_ms, predicted_ms``."""
    coverage: str | None = None
    """Which analyzed (rank, step) points the fit lacks (no usable sidecar line) and whose
    they are; None when it has them all."""

    @property
    def warning(self) -> str | None:
        """Why balancing by this model will not help, when ``r2 < LOW_R2`` or it is NaN;
        None for a fit that explains the busy time."""
        if self.r2 >= LOW_R2:
            return None
        r2 = "n/a (the busy time never varies)" if math.isnan(self.r2) else f"{self.r2:.4f}"
        return (
            f"R^2 {r2} is below {LOW_R2}: the busy time hardly follows the samples' lengths, so "
            "this model's compute does not grow with sequence length (a padded model costs the "
            "padded length whatever the sample's) or noise swamps it; balancing by it will not help"
        )


def fit_cost(analysis: Analysis) -> CostFit:
    """Fit the cost model on a run's busy time per (rank, step) and its step sidecars; the
    fit says which analyzed points it lacks (:attr:`CostFit.coverage`)."""
    run = analysis.run
    if run.sidecar is None or run.sidecar.empty:
        raise RunError(
            "the run has no step sidecars (steps.rank<R>.jsonl): no cost model to fit",
            path=run.path,
        )
    fit = fit_points(analysis.steps, run.sidecar, path=run.path)
    fit.coverage = _coverage(analysis.steps, fit.points)
    return fit


def _coverage(steps: pd.DataFrame, points: pd.DataFrame) -> str | None:
    """The line saying how many analyzed (rank, step) points have no sidecar line, and whose."""
    analyzed = pd.MultiIndex.from_frame(steps[["rank", "step"]])
    lacking = analyzed[~analyzed.isin(pd.MultiIndex.from_frame(points[["rank", "step"]]))]
    if lacking.empty:
        return None
    ranks = sorted({int(r) for r in lacking.get_level_values("rank")})
    return (
        f"fitted on {len(points)} of the {len(analyzed)} analyzed (rank, step) points: the other "
        f"{len(lacking)} (rank(s) {', '.join(map(str, ranks))}) have no usable step sidecar line"
    )


def fit_points(
    steps: pd.DataFrame, sidecar: pd.DataFrame, *, path: str | Location | None = None
) -> CostFit:
    """Fit on ``steps`` (columns ``rank, step, busy_ms``, as ``Analysis.steps``) joined with
    ``sidecar`` (``rank, step`` and ``FEATURES``, one row per (rank, step) as an analyzed
    run's: :mod:`fsobs.analysis.partial`) on (rank, step). ``path`` names the run in the error
    raised when fewer than ``MIN_POINTS`` points remain or the fit is all zero."""
    points = steps[["rank", "step", "busy_ms"]].merge(
        sidecar[["rank", "step", *FEATURES]], on=["rank", "step"], how="inner"
    )
    if len(points) < MIN_POINTS:
        raise RunError(
            "not enough steps with both a sidecar and a trace to fit the cost model "
            f"({len(points)} (rank, step) point(s), need {MIN_POINTS})",
            path=path,
        )
    x = points[list(FEATURES)].to_numpy(np.float64)
    measured_ms = points["busy_ms"].to_numpy(np.float64)
    coef = nonnegative_lstsq(x, measured_ms * 1e6)
    if not coef.any():
        raise RunError(
            "the fitted cost model is all zero (c0 = a = b = 0): the busy time never grows "
            f"with num_samples, len_sum or len_sq_sum over the {len(points)} (rank, step) "
            "points, so the model explains nothing and would make every plan arbitrary",
            path=path,
        )
    predicted_ms = x @ coef / 1e6
    residual = measured_ms - predicted_ms
    ss_tot = float(((measured_ms - measured_ms.mean()) ** 2).sum())
    ss_res = float((residual**2).sum())
    table = points[["rank", "step", *FEATURES]].assign(
        measured_ms=measured_ms, predicted_ms=predicted_ms
    )
    return CostFit(
        model=CostModel(c0=coef[0], a=coef[1], b=coef[2]),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
        rmse_ms=math.sqrt(ss_res / len(points)),
        n_points=len(points),
        points=table.reset_index(drop=True),
    )


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``argmin ||x·c - y||`` subject to ``c >= 0``, exactly, for a few columns.

    The optimum is the unconstrained least-squares solution on its set of non-zero
    coefficients (the KKT conditions), so every non-empty subset of columns is solved with
    ``np.linalg.lstsq`` (on columns scaled to unit norm, for conditioning), the subsets with a
    negative coefficient are dropped, and the smallest residual wins (all zeros if none fits).
    """
    num_cols = x.shape[1]
    norms = np.linalg.norm(x, axis=0)
    norms[norms == 0] = 1.0
    scaled = x / norms
    best = np.zeros(num_cols)
    best_res = float(y @ y)
    for size in range(1, num_cols + 1):
        for cols in combinations(range(num_cols), size):
            sub = scaled[:, list(cols)]
            sol = np.linalg.lstsq(sub, y, rcond=None)[0]
            if (sol < 0).any():
                continue
            res = float(((sub @ sol - y) ** 2).sum())
            if res < best_res:
                best_res = res
                best = np.zeros(num_cols)
                best[list(cols)] = sol
    return cast(np.ndarray, best / norms)
