"""Splitting a global batch whose rank cost is not a sum: a padded cost model (numpy only).

A model whose attention pads each rank's batch to its longest sample (HSTU's PyTorch path)
costs a rank's ``n`` samples of lengths ``L_i`` about::

    cost = batch + Σ_i c(L_i) + padded · n · max(L)²          (CostModel, shape "padded")

so a rank costs little only if its samples have *similar* lengths: one long sample makes every
sample of its rank cost ``max(L)²``. Balancing the per-sample costs (Karmarkar-Karp on
``c(L)``, :func:`optim.balance.partition`) spreads the long samples over the ranks, and every
rank pads to its own long one. :func:`partition_padded` minimizes the largest rank cost
instead:

1. sort the samples by length (ties by position): ``L_(0) <= L_(1) <= ...``;
2. cut the sorted order into contiguous groups, one per rank (similar lengths on one rank;
   for the padded term alone, some optimal split with given counts is contiguous: the longest
   group can take the longest samples without its maximum growing, and so on down):

   - equal counts: the chunks of ``n / W`` samples;
   - unequal counts: the smallest bottleneck ``T`` for which the greedy cut (each group, from
     the shortest samples on, as long as it costs ``<= T``) needs at most ``W`` groups, by
     bisection on ``T``. A group's cost only grows as it extends, so the greedy cut is the
     exact feasibility test and the bisection finds the best contiguous split to float
     precision in ``O(W · log n)`` per probe (a DP over cut points costs ``O(W · n²)``, or
     ``O(W · n log n)`` with monotone cuts: too slow in Python at 16k samples and 256 ranks).
     The final cut leaves each later group at least one sample, so no rank is empty when
     there are at least ``W`` samples (a group split in two costs no more than the whole);

3. keep the Karmarkar-Karp split of the per-sample part ``c(L)`` (same counts rule) when it has
   the lower largest rank cost under the padded model (the contiguous split on a tie): never
   worse than the additive split. With equal counts the rank holding the longest sample costs
   at least ``batch + (n / W) · padded · max(L)²`` whatever the split, so there the gain can
   only come from the per-sample terms; unequal counts let that rank take fewer samples.

::

    padded = 1, nothing else; lengths 6 6 5 5 5 5, 2 ranks, unequal counts
    KK on L² (36 36 25 25 25 25):   [6 5 5] [6 5 5]   L² sums 86 86   padded costs 108 108
    sorted, cut:                    [5 5 5 5] [6 6]                   padded costs 100  72

The result has the form of :func:`optim.balance.partition`'s: each part ascending positions,
parts ordered by their smallest position, empty parts last; every position exactly once; a
pure function of the lengths and the model (ties by position), so every rank plans the same.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from optim.balance import CostModel, check_split, check_values, partition

__all__ = ["PaddedCosts", "partition_padded", "rank_cost", "split_costs"]

CostFn = Callable[[np.ndarray], np.ndarray]
"""Per-sample costs of per-sample lengths (an additive :class:`CostModel`, ``FreeScale.costs``)."""

_PRECISION = 1e-12
"""The bottleneck search stops when its bracket is this narrow, relative to its top."""


@dataclass(frozen=True)
class PaddedCosts:
    """A global batch under a padded cost model: what a step plan splits
    (:meth:`optim.plan.StepPlan.make`) where per-sample costs are not defined."""

    lengths: np.ndarray
    """Per sample, in global-batch order (1-D, finite, >= 0)."""
    model: CostModel

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", check_values(self.lengths, "lengths"))

    @property
    def size(self) -> int:
        return int(self.lengths.size)

    def loads(self, parts: Sequence[Sequence[int] | np.ndarray]) -> np.ndarray:
        """Each part's cost (:meth:`CostModel.batch_cost` of its samples)."""
        return np.array(
            [self.model.batch_cost(self.lengths[np.asarray(p, dtype=np.int64)]) for p in parts]
        )


def split_costs(model: CostModel | CostFn | None, lengths: np.ndarray) -> np.ndarray | PaddedCosts:
    """What a plan splits for ``model``: a padded :class:`CostModel`'s :class:`PaddedCosts`,
    else the per-sample costs (the lengths themselves without a model, as ``FreeScale.costs``)."""
    if isinstance(model, CostModel) and model.shape == "padded":
        return PaddedCosts(np.asarray(lengths), model)
    if model is None:
        return np.asarray(lengths, dtype=np.float64)
    return np.asarray(model(np.asarray(lengths)))


def rank_cost(model: CostModel | CostFn | None, lengths: np.ndarray) -> float:
    """One rank's estimated cost of a batch of ``lengths`` (a sidecar's ``est_cost``):
    :meth:`CostModel.batch_cost`, the sum of a per-sample cost function, or the tokens without
    a model."""
    if isinstance(model, CostModel):
        return model.batch_cost(np.asarray(lengths))
    if model is None:
        return float(np.asarray(lengths, dtype=np.float64).sum())
    return float(np.sum(model(np.asarray(lengths))))


def partition_padded(
    lengths: Sequence[float] | np.ndarray,
    num_parts: int,
    model: CostModel,
    *,
    equal_size: bool = True,
) -> list[list[int]]:
    """Split ``range(len(lengths))`` into ``num_parts`` parts minimizing the largest
    :meth:`CostModel.batch_cost` (module docstring). ``equal_size=True`` requires
    ``len(lengths) % num_parts == 0``; ValueError naming the argument."""
    arr, k = check_split(lengths, num_parts, equal_size, "lengths")
    n = arr.size
    order = np.lexsort((np.arange(n), arr))  # ascending length, ties by position
    cut = _Cut(arr[order], model)
    bounds = [i * (n // k) for i in range(k + 1)] if equal_size else cut.bottleneck_bounds(k)
    parts = [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    costs = PaddedCosts(arr, model)
    additive = partition(model.additive_part()(arr), k, method="kk", equal_size=equal_size)
    if costs.loads(additive).max(initial=0.0) < costs.loads(parts).max(initial=0.0):
        parts = [np.asarray(p, dtype=np.int64) for p in additive]
    out = [np.sort(p).tolist() for p in parts]
    out.sort(key=lambda p: p[0] if p else n)
    return out


class _Cut:
    """Costs of contiguous groups of the samples sorted by ascending length."""

    def __init__(self, sorted_lengths: np.ndarray, model: CostModel) -> None:
        self.n = sorted_lengths.size
        self.square: list[float] = (sorted_lengths * sorted_lengths).tolist()
        per_sample = model.additive_part()(sorted_lengths)
        self.prefix: list[float] = np.concatenate([[0.0], np.cumsum(per_sample)]).tolist()
        self.batch, self.padded = model.batch, model.padded

    def cost(self, lo: int, hi: int) -> float:
        """Samples ``lo .. hi - 1`` on one rank (``hi > lo``): the longest is the last."""
        pad = self.padded * (hi - lo) * self.square[hi - 1]
        return self.batch + (self.prefix[hi] - self.prefix[lo]) + pad

    def reach(self, lo: int, limit: float, last: int) -> int:
        """The largest ``hi <= last`` with ``cost(lo, hi) <= limit`` (``lo + 1`` at least)."""
        ends = range(lo + 2, last + 1)
        return lo + 1 + bisect.bisect_right(ends, limit, key=lambda hi: self.cost(lo, hi))

    def groups(self, limit: float, k: int) -> list[int]:
        """The greedy cut under ``limit`` into at most ``k`` groups, each later group left at
        least one sample; its bounds ``[0, ..., n]`` (fewer than ``k + 1`` when it runs out of
        groups before the end: ``limit`` is infeasible)."""
        bounds, lo = [0], 0
        while lo < self.n and len(bounds) <= k:
            lo = self.reach(lo, limit, self.n - (k - len(bounds)))
            bounds.append(lo)
        return bounds

    def bottleneck_bounds(self, k: int) -> list[int]:
        """The bounds of the best contiguous cut into ``k`` groups (empty ones at the end)."""
        n = self.n
        if n <= k:  # one sample each: the bottleneck is the costliest sample alone
            return list(range(n + 1)) + [n] * (k - n)
        # below either bound no cut is feasible: the costliest sample alone, and the mean
        # group (a group pads each of its samples to at least its own length)
        single = max(self.cost(i, i + 1) for i in range(n))
        spread = (k * self.batch + self.prefix[n] + self.padded * sum(self.square)) / k
        lo, hi = max(single, spread), self.cost(0, n)
        best = self.groups(lo, k)
        if best[-1] != n:
            while hi - lo > _PRECISION * hi:
                mid = (lo + hi) / 2
                if self.groups(mid, k)[-1] == n:
                    hi = mid
                else:
                    lo = mid
            best = self.groups(hi, k)
        return best + [n] * (k + 1 - len(best))
