"""A balance window: the samples of ``K`` consecutive global batches dealt into ``K`` steps so
that every rank costs the same in every step (numpy only, no torch).

Inside one global batch no split can beat its costliest sample: with heavy-tailed lengths a
few samples ("whales") cost more than a rank's mean load, and the rank that trains one sets
the step time. A window moves samples *between* the steps of the window, so that the steps
that hold the whales give every rank a whale's worth of work and the other steps are balanced
at a lower level. Each sample is trained exactly once, in one of the ``K`` steps of its
window: at most ``K - 1`` steps from its original step.

The deal (:func:`deal_window`), for a window of ``n`` samples of costs ``c`` into ``K`` steps
of ``W`` ranks, that is ``K·W`` bins ``(step k, rank r)``:

1. sort the samples of positive cost by descending cost (ties by position): ``c_0 >= c_1 ...``;
2. step levels, heaviest first: when steps ``0 .. k-1`` hold the ``k·W`` costliest samples,
   one per rank, step ``k``'s costliest is ``c_{k·W}``, so its level is
   ``ℓ_k = max(c_{k·W}, R_k / ((K - k)·W))``, with ``R_k`` the cost not yet given a level
   (``R_0`` = the total, ``R_{k+1} = max(R_k - W·ℓ_k, 0)``);
3. LPT towards the levels: each sample, costliest first, to the bin with the largest gap
   ``ℓ_k - load`` (the lowest bin index on a tie); with equal levels this is plain LPT. The
   last samples go to empty bins when there are no more of them than empty bins (that the
   zero-cost samples will not fill): a window of at least ``K·W`` samples leaves no bin empty;
4. the samples of zero cost, in position order, each to a bin with the fewest samples;
5. bin ``(k, r)`` is rank ``r``'s share of step ``k``; each share lists ascending positions;
6. the window keeps this deal unless planning each of its global batches alone (``kk`` with
   equal counts, or ``lpt``) gives a smaller sum of step maxima (the window's step time): so a
   window is never worse than the per-step plan (small windows of few samples per rank can be).

::

    K = 2 steps, W = 3 ranks; the two global batches' costs (the 9 is a whale)

    batch 0: 9 2 1 1 1 2     per-step lpt:  step 0: [9] [2 1 1] [2 1]    max 9
    batch 1: 3 3 2 2 2 1                    step 1: [3 2] [3 1] [2 2]    max 5
                             bubble = W·(9 + 5) - 29 = 13

    levels (sorted 9 3 3 2 2 2 2 2 1 1 1 1, total 29):
        l_0 = max(c_0 = 9, 29 / 6) = 9,   l_1 = max(c_3 = 2, (29 - 27) / 3) = 2

    window: step 0: [9] [3 2 2 2] [3 2 2 1]      9 9 8   (9 samples)
            step 1: [1] [1] [1]                  1 1 1   ( 3 samples)
                             bubble = W·(9 + 1) - 29 = 1

The whale's step gives every rank about a whale's worth, so no rank waits long in it; the
other steps share what is left at their own, lower level, with costs still mixed (LPT deals
the costliest first into every step that has room, not one step after the other). The steps'
sizes (samples and tokens) differ, and the loss weights use each step's own counts
(:func:`optim.weights.loss_weight`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from optim.balance import partition

__all__ = ["deal_window", "step_levels"]


def step_levels(sorted_costs: np.ndarray, num_steps: int, world_size: int) -> list[float]:
    """Step 2 of the deal: the level of each step of the window, heaviest first, from the
    positive costs in descending order."""
    rest = float(sorted_costs.sum())
    levels = []
    for k in range(num_steps):
        top = float(sorted_costs[k * world_size]) if k * world_size < sorted_costs.size else 0.0
        level = max(top, rest / ((num_steps - k) * world_size))
        levels.append(level)
        rest = max(rest - world_size * level, 0.0)
    return levels


def deal_window(costs: Sequence[np.ndarray], world_size: int) -> list[list[np.ndarray]]:
    """``[step][rank]`` ascending int64 positions into the window (its global batches' costs
    ``costs`` concatenated in order): every position exactly once. The levelled deal (module
    docstring) unless a per-step plan (``kk`` with equal counts, ``lpt``: each sample in its
    own step) has a smaller sum of step maxima: never worse than planning each step alone."""
    batches = [np.asarray(c, dtype=np.float64) for c in costs]
    if not batches:
        raise ValueError("costs: a window needs at least one global batch")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be an int >= 1, got {world_size!r}")
    pooled = np.concatenate(batches)
    if pooled.ndim != 1 or (pooled.size and (not np.isfinite(pooled).all() or pooled.min() < 0)):
        raise ValueError("costs: must be 1-D arrays of finite costs >= 0")
    best = _level_deal(pooled, len(batches), world_size)
    for method in ("kk", "lpt"):
        if method == "kk" and any(b.size % world_size for b in batches):
            continue
        per_step = _per_step(batches, world_size, method)
        if _sum_of_maxima(pooled, per_step) < _sum_of_maxima(pooled, best):
            best = per_step
    return best


def _per_step(batches: list[np.ndarray], world_size: int, method: str) -> list[list[np.ndarray]]:
    """Each global batch planned alone, as positions into the window."""
    starts = np.cumsum([0] + [b.size for b in batches])
    return [
        [
            np.asarray(p, dtype=np.int64) + start
            for p in partition(b, world_size, method=method, equal_size=method == "kk")
        ]
        for b, start in zip(batches, starts[:-1].tolist(), strict=True)
    ]


def _sum_of_maxima(pooled: np.ndarray, steps: list[list[np.ndarray]]) -> float:
    return sum(max((float(pooled[p].sum()) for p in parts), default=0.0) for parts in steps)


def _level_deal(arr: np.ndarray, num_steps: int, world_size: int) -> list[list[np.ndarray]]:
    """Steps 1-5 of the deal (module docstring)."""
    positive = np.flatnonzero(arr > 0)
    order = positive[np.argsort(-arr[positive], kind="stable")]
    levels = step_levels(arr[order], num_steps, world_size)
    num_bins = num_steps * world_size
    owner = np.empty(arr.size, dtype=np.int64)
    zeros = np.flatnonzero(arr == 0)
    _deal_positive(owner, order, arr, levels, world_size, zeros.size)
    _deal_zeros(owner, zeros, num_bins)
    by_bin = np.argsort(owner, kind="stable")  # positions ascending within each bin
    bounds = np.searchsorted(owner[by_bin], np.arange(1, num_bins))
    bins = np.split(by_bin, bounds)
    return [bins[k * world_size : (k + 1) * world_size] for k in range(num_steps)]


def _deal_positive(
    owner: np.ndarray,
    order: np.ndarray,
    arr: np.ndarray,
    levels: list[float],
    world_size: int,
    num_zeros: int,
) -> None:
    """Step 3: LPT towards the levels. Once no more samples are left than the empty bins that
    the ``num_zeros`` zero-cost samples will not fill, each goes to one of those, so that no bin
    is left empty that could have a sample."""
    num_bins = len(levels) * world_size
    heap = [(-levels[b // world_size], b) for b in range(num_bins)]  # (load - level, bin)
    empty = np.ones(num_bins, dtype=bool)
    num_empty = num_bins
    positions = order.tolist()
    for i, (pos, value) in enumerate(zip(positions, arr[order].tolist(), strict=True)):
        left = len(positions) - i
        if left <= num_empty - num_zeros:
            owner[positions[i:]] = np.flatnonzero(empty)[:left]
            return
        key, b = heap[0]
        owner[pos] = b
        num_empty -= int(empty[b])
        empty[b] = False
        heapq.heapreplace(heap, (key + value, b))


def _deal_zeros(owner: np.ndarray, zeros: np.ndarray, num_bins: int) -> None:
    """Step 4: each zero-cost position (ascending) to a bin with the fewest samples (the
    lowest bin index on a tie)."""
    placed = np.delete(owner, zeros) if zeros.size else owner
    counts = np.bincount(placed, minlength=num_bins)
    heap = [(int(n), b) for b, n in enumerate(counts.tolist())]
    heapq.heapify(heap)
    for pos in zeros.tolist():
        n, b = heap[0]
        owner[pos] = b
        heapq.heapreplace(heap, (n + 1, b))
