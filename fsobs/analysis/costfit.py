"""Fit the per-sample cost model of :class:`optim.balance.CostModel` from a measured run.

Each (rank, step) with both a step-sidecar row and a bubble-table row is one point. A rank that
trains ``n`` samples of lengths ``L_i`` in a step is busy (``busy_ms`` of
:func:`fsobs.analysis.bubbles.tables.bubble_table`) for the sum of their costs::

    busy_ns(r, s) = Σ_i c(L_i) = c0 · n + a · ΣL + b · ΣL²,     c(L) = c0 + a·L + b·L²

so the coefficients are a linear least-squares fit on the sidecar's ``num_samples``,
``len_sum`` and ``len_sq_sum``, constrained to ``c0, a, b >= 0`` (the partitioners need
non-negative costs). Units: the model's cost is **nanoseconds of busy time per sample**.

The **padded** shape (``shape="padded"``) is a model whose attention pads a rank's batch to its
longest sample (HSTU's PyTorch path): a rank's busy time is not a sum over its samples::

    busy_ns(r, s) = batch + c0 · n + a · ΣL + padded · n · max(L)²

fitted the same way on ``1``, ``num_samples``, ``len_sum`` and ``num_samples · len_max²`` (the
sidecar's ``len_max``); its :class:`optim.balance.CostModel` has ``b = 0`` and the shape
``"padded"``. A baseline whose ranks all train the same number of samples cannot tell ``batch``
from ``c0 · n``: the fit puts that time in either, and both predict the same for equal counts.
``shape="auto"`` fits both and keeps the one of higher R² (the additive one on a tie or when
neither has one), saying so in :attr:`CostFit.choice`.

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

from fsobs.analysis.fit_shapes import FIT_SHAPES
from fsobs.analysis.pipeline import Analysis
from fsobs.errors import RunError
from fsobs.storage import Location
from optim.balance import CostModel

FEATURES = ("num_samples", "len_sum", "len_sq_sum")
"""Sidecar columns multiplying ``c0``, ``a`` and ``b``."""
PADDED_FEATURES = ("num_samples", "len_sum", "len_max")
"""Sidecar columns of the padded shape (``1``, ``n``, ``ΣL`` and ``n · max(L)²``)."""
MIN_POINTS = 4
LOW_R2 = 0.3
"""Below this R² (or without one) a fit explains too little to balance by
(:attr:`CostFit.warning`)."""


@dataclass
class CostFit:
    """A fitted cost model and how well it explains the measured busy time."""

    model: CostModel
    """Coefficients in ns of busy time per sample (``ids`` stays 0); a padded fit's ``batch``
    and ``padded`` too (:attr:`CostModel.shape`)."""
    r2: float
    """``1 - SS_res / SS_tot`` of the busy time per (rank, step); NaN when it never varies."""
    rmse_ms: float
    """``sqrt(mean((measured - predicted)²))`` in ms."""
    n_points: int
    points: pd.DataFrame
    """``rank, step``, the shape's sidecar columns (``FEATURES`` or ``PADDED_FEATURES``),
    ``measured_ms, predicted_ms``."""
    shape: str = "additive"
    """The shape fitted: ``additive`` or ``padded`` (the model's own shape may be additive
    even so, when the padded terms fit as 0)."""
    choice: str | None = None
    """With ``shape="auto"``: the line saying which shape explains more and was kept."""
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
        if self.shape == "padded":
            return (
                f"R^2 {r2} is below {LOW_R2}: the busy time hardly follows the samples' "
                "lengths under the padded shape either (n, sum(L), n * max(L)^2), or noise "
                "swamps it; balancing by it will not help"
            )
        return (
            f"R^2 {r2} is below {LOW_R2}: the busy time hardly follows the samples' lengths, so "
            "this model's compute does not grow with sequence length (a padded model costs the "
            "padded length whatever the sample's: try --shape padded) or noise swamps it; "
            "balancing by it will not help"
        )


def fit_cost(analysis: Analysis, *, shape: str = "additive") -> CostFit:
    """Fit the cost model of ``shape`` (:data:`FIT_SHAPES`) on a run's busy time per (rank,
    step) and its step sidecars; the fit says which analyzed points it lacks
    (:attr:`CostFit.coverage`)."""
    run = analysis.run
    if run.sidecar is None or run.sidecar.empty:
        raise RunError(
            "the run has no step sidecars (steps.rank<R>.jsonl): no cost model to fit",
            path=run.path,
        )
    fit = fit_points(analysis.steps, run.sidecar, path=run.path, shape=shape)
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
    steps: pd.DataFrame,
    sidecar: pd.DataFrame,
    *,
    path: str | Location | None = None,
    shape: str = "additive",
) -> CostFit:
    """Fit the cost model of ``shape`` (:data:`FIT_SHAPES`) on ``steps`` (columns ``rank, step,
    busy_ms``, as ``Analysis.steps``) joined with ``sidecar`` (``rank, step`` and the shape's
    columns, ``FEATURES`` or ``PADDED_FEATURES``, one row per (rank, step) as an analyzed run's:
    :mod:`fsobs.analysis.partial`) on (rank, step). ``path`` names the run in the error raised
    when fewer than ``MIN_POINTS`` points remain or the fit is all zero (with ``auto``: both)."""
    if shape not in FIT_SHAPES:
        raise ValueError(f"shape: unknown {shape!r}, expected one of {list(FIT_SHAPES)}")
    if shape != "auto":
        return _fit(steps, sidecar, path, shape)
    fits, errors = [], []
    for one in ("additive", "padded"):
        try:
            fits.append(_fit(steps, sidecar, path, one))
        except RunError as exc:
            errors.append(exc)
    if not fits:
        raise errors[0]
    best = max(fits, key=lambda f: -math.inf if math.isnan(f.r2) else f.r2)  # additive on a tie
    best.choice = _choice(fits, best)
    return best


def _choice(fits: list[CostFit], best: CostFit) -> str:
    """The line of :attr:`CostFit.choice`."""
    if len(fits) == 1:
        other = "padded" if best.shape == "additive" else "additive"
        return f"the {other} shape fits nothing (all zero): kept the {best.shape} one"
    r2 = ", ".join(f"{f.shape} R^2 {f.r2:.4f}" for f in fits)
    return f"{r2}: the {best.shape} shape explains more of the busy time, kept"


def _fit(
    steps: pd.DataFrame, sidecar: pd.DataFrame, path: str | Location | None, shape: str
) -> CostFit:
    """The fit of one shape (``additive`` or ``padded``)."""
    columns = FEATURES if shape == "additive" else PADDED_FEATURES
    points = steps[["rank", "step", "busy_ms"]].merge(
        sidecar[["rank", "step", *columns]], on=["rank", "step"], how="inner"
    )
    if len(points) < MIN_POINTS:
        raise RunError(
            "not enough steps with both a sidecar and a trace to fit the cost model "
            f"({len(points)} (rank, step) point(s), need {MIN_POINTS})",
            path=path,
        )
    x = _design(points, shape)
    measured_ms = points["busy_ms"].to_numpy(np.float64)
    coef = nonnegative_lstsq(x, measured_ms * 1e6)
    if not coef.any():
        terms = (
            "num_samples, len_sum or len_sq_sum"
            if shape == "additive"
            else ("the rank, num_samples, len_sum or num_samples * len_max^2")
        )
        raise RunError(
            f"the fitted cost model is all zero ({_zero(shape)}): the busy time never grows "
            f"with {terms} over the {len(points)} (rank, step) "
            "points, so the model explains nothing and would make every plan arbitrary",
            path=path,
        )
    predicted_ms = x @ coef / 1e6
    residual = measured_ms - predicted_ms
    ss_tot = float(((measured_ms - measured_ms.mean()) ** 2).sum())
    ss_res = float((residual**2).sum())
    table = points[["rank", "step", *columns]].assign(
        measured_ms=measured_ms, predicted_ms=predicted_ms
    )
    if shape == "additive":
        model = CostModel(c0=coef[0], a=coef[1], b=coef[2])
    else:
        model = CostModel(batch=coef[0], c0=coef[1], a=coef[2], b=0.0, padded=coef[3])
    return CostFit(
        model=model,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
        rmse_ms=math.sqrt(ss_res / len(points)),
        n_points=len(points),
        points=table.reset_index(drop=True),
        shape=shape,
    )


def _design(points: pd.DataFrame, shape: str) -> np.ndarray:
    """The fit's columns: ``n, ΣL, ΣL²``, or ``1, n, ΣL, n · max(L)²`` (padded)."""
    if shape == "additive":
        return points[list(FEATURES)].to_numpy(np.float64)
    n = points["num_samples"].to_numpy(np.float64)
    longest = points["len_max"].to_numpy(np.float64)
    total = points["len_sum"].to_numpy(np.float64)
    return np.column_stack([np.ones_like(n), n, total, n * longest * longest])


def _zero(shape: str) -> str:
    return "c0 = a = b = 0" if shape == "additive" else "batch = c0 = a = padded = 0"


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
