"""Several control / test pairs: the bubble reduction over pairs, with a Student t interval.

One pair's interval (:mod:`fsobs.analysis.comparison.ab`) resamples the steps of that pair: it
says how precisely that pair's reduction is known, not how much another pair of runs (another
seed, node or day) would give. With ``n`` pairs, matched by position and each its own
:class:`~fsobs.analysis.comparison.ab.Comparison` with reduction ``r_i``::

    reduction = mean(r_1 .. r_n)
    CI        = reduction ± t(n - 1, (1 + confidence) / 2) · sd(r_1 .. r_n) / sqrt(n)

(``sd`` with ``n - 1``; ``t(d, p)`` the p-quantile of Student's t with ``d`` degrees of
freedom), overall and per bubble class. Why this interval and not another: pairs are few (3 to
5 runs each side is what one affords). A bootstrap over 3 pairs has 10 distinct resamples and its
percentile interval never leaves ``[min r_i, max r_i]``, so it is far too narrow; the
distribution-free interval of a median (order statistics) needs 6 pairs before
``[min r_i, max r_i]`` covers 95% (at 3 pairs it covers 75%). Student's t widens with few pairs
(``t(2, 0.975) = 4.30``) and assumes only that the pairs' reductions scatter roughly normally,
which a ratio of means over many steps makes plausible. With fewer than :data:`MIN_PAIRS` pairs
no interval is given (NaN): with 2 it would be ``± 12.7 · sd / sqrt(2)``, wider than any answer.
A class whose reduction is NaN in some pair (~0 in that control) is NaN over the pairs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES
from fsobs.analysis.comparison.ab import Comparison

MIN_PAIRS = 3
"""Fewer pairs than this give no interval over pairs."""


@dataclass
class PairSummary:
    """Pairs of runs compared one by one, and their reductions over the pairs."""

    pairs: list[Comparison]
    """Pair ``i``: the ``i``-th control against the ``i``-th test."""
    confidence: float
    bubble_reduction: float
    """Mean over the pairs of each pair's ``bubble_reduction``; NaN if one is NaN."""
    bubble_reduction_ci: tuple[float, float]
    """Student t interval over the pairs (module docstring); NaN with < ``MIN_PAIRS`` pairs."""
    by_class: dict[str, float]
    """The same mean per class (``BUBBLE_CLASSES``)."""
    by_class_ci: dict[str, tuple[float, float]]
    warnings: list[str]
    """What holds for the pairs together: too few for an interval, pairs on other batches."""


def summarize_pairs(pairs: Sequence[Comparison]) -> PairSummary:
    """The reductions over ``pairs`` (all compared at one confidence level)."""
    if not pairs:
        raise ValueError("pairs: need at least one comparison")
    confidence = pairs[0].confidence
    if any(p.confidence != confidence for p in pairs):
        raise ValueError("pairs: the comparisons have different confidence levels")
    overall = mean_interval([p.bubble_reduction for p in pairs], confidence)
    classes = {k: mean_interval([p.by_class[k] for p in pairs], confidence) for k in BUBBLE_CLASSES}
    return PairSummary(
        pairs=list(pairs),
        confidence=confidence,
        bubble_reduction=overall[0],
        bubble_reduction_ci=overall[1],
        by_class={k: v[0] for k, v in classes.items()},
        by_class_ci={k: v[1] for k, v in classes.items()},
        warnings=_pair_warnings(pairs),
    )


def mean_interval(values: Sequence[float], confidence: float) -> tuple[float, tuple[float, float]]:
    """``mean(values)`` and its Student t interval (module docstring); NaN when a value is NaN,
    and no interval (NaNs) with fewer than ``MIN_PAIRS`` values."""
    arr = np.asarray(values, np.float64)
    if not len(arr) or np.isnan(arr).any():
        return math.nan, (math.nan, math.nan)
    mean = float(arr.mean())
    if len(arr) < MIN_PAIRS:
        return mean, (math.nan, math.nan)
    half = t_quantile((1 + confidence) / 2, len(arr) - 1) * float(arr.std(ddof=1))
    half /= math.sqrt(len(arr))
    return mean, (mean - half, mean + half)


def _pair_warnings(pairs: Sequence[Comparison]) -> list[str]:
    out = []
    if len(pairs) < MIN_PAIRS:
        out.append(
            f"{len(pairs)} pair(s): no interval over pairs (it needs at least {MIN_PAIRS}; "
            "each pair's own interval covers its steps, not run-to-run variation)"
        )
    other = [str(i) for i, p in enumerate(pairs, start=1) if p.same_batches is False]
    if other:
        out.append(f"pair(s) {', '.join(other)} did not see the same global batches")
    return out


def t_quantile(p: float, dof: int) -> float:
    """The ``p``-quantile (``0.5 <= p < 1``) of Student's t with ``dof >= 1`` degrees of
    freedom, by bisection on :func:`t_cdf`."""
    if not 0.5 <= p < 1:
        raise ValueError(f"p: must be in [0.5, 1), got {p}")
    if dof < 1:
        raise ValueError(f"dof: must be >= 1, got {dof}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < p:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, dof) < p else (lo, mid)
    return (lo + hi) / 2


def t_cdf(x: float, dof: int) -> float:
    """``P(T <= x)`` for Student's t with integer ``dof``, in closed form (Abramowitz and
    Stegun 26.7.3 / 26.7.4): with ``θ = atan(x / sqrt(dof))`` and ``c = cos θ``,
    ``P(|T| < x)`` is ``sin θ · (1 + c²/2 + (1·3)/(2·4) c⁴ + ... up to c^(dof-2))`` for even
    ``dof``, ``(2/π) · (θ + sin θ · (c + (2/3) c³ + ... up to c^(dof-2)))`` for odd ``dof``
    (``2θ/π`` for 1)."""
    theta = math.atan(abs(x) / math.sqrt(dof))
    c2 = math.cos(theta) ** 2
    if dof % 2 == 0:
        term = series = 1.0
        for k in range(1, dof // 2):
            term *= (2 * k - 1) / (2 * k) * c2
            series += term
        inside = math.sin(theta) * series
    else:
        term = series = math.cos(theta) if dof > 1 else 0.0
        for k in range(1, (dof - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c2
            series += term
        inside = 2 / math.pi * (theta + math.sin(theta) * series)
    return 0.5 + math.copysign(inside, x) / 2
