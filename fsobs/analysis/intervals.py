"""Interval-set arithmetic on numpy arrays (any numeric dtype; integer ns stay exact).

An interval set is a pair ``(starts, ends)`` of equal-length arrays of half-open intervals
``[starts[i], ends[i])``. :func:`union` turns any set into the canonical form (sorted,
disjoint, touching intervals merged); the set operations take and return canonical sets.

Any boolean formula over several sets is evaluated the same way, in one pass: cut the line
at every boundary of every set into elementary segments (:func:`segments`), where membership
in each set is constant, combine the memberships segment by segment, and join the kept
segments back into intervals (:func:`runs`)::

    a            |=======|        |===|
    b                |=======|
    bounds       0   1   2   3    4   5     segments 0 to 4 between them
    a and not b  |===|            |===|     segments 0 and 4 kept
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Canonical union of ``[starts[i], ends[i])``: sorted, disjoint, touching ones merged."""
    starts = np.asarray(starts)
    ends = np.asarray(ends)
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new_group = np.empty(len(starts), dtype=bool)
    new_group[0] = True
    new_group[1:] = starts[1:] > reach[:-1]
    group_end = np.concatenate((np.flatnonzero(new_group[1:]), [len(starts) - 1]))
    return starts[new_group], np.maximum(reach[group_end], starts[new_group])


def length(iv: Intervals) -> float:
    """Total length of a canonical set."""
    return float((iv[1] - iv[0]).sum())


def covered(iv: Intervals, points: np.ndarray) -> np.ndarray:
    """Whether each point lies in the canonical set ``iv``."""
    return np.searchsorted(iv[0], points, "right") > np.searchsorted(iv[1], points, "right")


def segments(layers: Sequence[Intervals]) -> tuple[np.ndarray, np.ndarray]:
    """Cut the line at every boundary of every set in ``layers``.

    Returns ``bounds`` (the distinct boundaries, sorted) and ``cover``, a boolean matrix with
    one row per elementary segment ``[bounds[i], bounds[i + 1])`` and one column per layer:
    whether the layer covers that segment. A layer need not be canonical (its intervals may
    overlap, touch or be empty; each needs ``start <= end``). No boundary lies inside a
    segment, so membership anywhere in it is membership at its start: nothing is probed at a
    midpoint (a float64 is exact to 256 ns only around 1.8e18 ns).
    """
    starts = np.concatenate([layer[0] for layer in layers])
    ends = np.concatenate([layer[1] for layer in layers])
    bounds = np.unique(np.concatenate([starts, ends]))
    num_layers = len(layers)
    if len(bounds) < 2:
        return bounds, np.zeros((0, num_layers), dtype=bool)
    column = np.repeat(np.arange(num_layers), [len(layer[0]) for layer in layers])
    size = len(bounds) * num_layers
    opened = np.bincount(np.searchsorted(bounds, starts) * num_layers + column, minlength=size)
    closed = np.bincount(np.searchsorted(bounds, ends) * num_layers + column, minlength=size)
    depth = np.cumsum((opened - closed).reshape(len(bounds), num_layers), axis=0)
    return bounds, depth[:-1] > 0


def runs(bounds: np.ndarray, keep: np.ndarray, label: np.ndarray | None = None) -> Intervals:
    """The canonical set of the elementary segments where ``keep`` holds (:func:`segments`):
    consecutive kept segments joined into one interval, unless ``label`` (one value per
    segment) differs between them. With labels, each run lies within one label and runs of
    different labels may touch."""
    joined = keep[1:] & keep[:-1]
    if label is not None:
        joined &= label[1:] == label[:-1]
    first = np.flatnonzero(keep & ~np.concatenate([[False], joined]))
    last = np.flatnonzero(keep & ~np.concatenate([joined, [False]]))
    return bounds[first], bounds[last + 1]


def _combine(a: Intervals, b: Intervals, keep: str) -> Intervals:
    bounds, cover = segments([a, b])
    in_a, in_b = cover[:, 0], cover[:, 1]
    mask = {"and": in_a & in_b, "minus": in_a & ~in_b, "or": in_a | in_b}[keep]
    return runs(bounds, mask)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    return _combine(a, b, "and")


def subtract(a: Intervals, b: Intervals) -> Intervals:
    return _combine(a, b, "minus")


def merge(a: Intervals, b: Intervals) -> Intervals:
    return _combine(a, b, "or")


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    """The part of a canonical set inside ``[lo, hi)``."""
    starts = np.maximum(iv[0], lo)
    ends = np.minimum(iv[1], hi)
    keep = ends > starts
    return starts[keep], ends[keep]


def clip_each(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> list[Intervals]:
    """:func:`clip` of a canonical set to each window ``[lo[k], hi[k])`` (int64 arrays; windows
    may overlap), in one pass: the candidates of window k are the intervals from the first one
    ending after ``lo[k]`` to the last one starting before ``hi[k]``, all windows' candidates
    are clipped together, and each window's result is a view of the kept ones."""
    first = np.searchsorted(iv[1], lo, "right")
    window, at = concat_ranges(first, np.maximum(np.searchsorted(iv[0], hi, "left") - first, 0))
    starts = np.maximum(iv[0][at], lo[window])
    ends = np.minimum(iv[1][at], hi[window])
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    bounds = [0, *np.cumsum(np.bincount(window[keep], minlength=len(lo))).tolist()]
    return [(starts[a:b], ends[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def concat_ranges(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions ``first[k], ..., first[k] + count[k] - 1`` of every k, concatenated, and
    the k of each (``count`` >= 0)."""
    owner = np.repeat(np.arange(len(first)), count)
    offset = np.repeat(first - (np.cumsum(count) - count), count)  # k's first minus its start
    return owner, np.arange(len(owner)) + offset


def position(ordered: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Position of each of ``values`` in ``ordered`` (sorted, distinct), -1 where absent."""
    if not len(ordered):
        return np.full(len(values), -1, np.int64)
    at = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return np.where(ordered[at] == values, at, -1)
