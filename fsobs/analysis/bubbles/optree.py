"""The op tree of one CPU thread: which op is innermost at every instant, and each op's self time.

The ops of one thread nest (a parent op encloses the ops it calls). At each instant the
**innermost op** is the deepest op that covers it; the CPU bubble rules of
:mod:`fsobs.analysis.bubbles` ask whether that op is a compute op::

    depth 0   aten::linear |--------------------------|
    depth 1                  |aten::addmm------|  |aten::t|
    depth 2                     |resolve_conj|
    innermost     linear  addmm  resolve_conj addmm linear t linear

With ops sorted by start (longer first on ties), the depth of op ``i`` is the number of ops
before it that still cover its start: ``i - #{ends <= start_i}`` (an op that ended before ``i``
started is before it in that order). Ops of one depth are disjoint, so the instants whose
innermost op is one of a chosen set are, depth by depth, the chosen ops of that depth minus
every op one level deeper. Zero-length ops cover no instant and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from fsobs.analysis import intervals as iv


@dataclass(frozen=True)
class OpTree:
    """Ops of one thread in nesting order (start ascending, longer first on ties)."""

    rows: np.ndarray
    """Position of each op in the arrays given to :func:`op_tree`."""
    start: np.ndarray
    end: np.ndarray
    depth: np.ndarray
    parent: np.ndarray
    """Index (into this tree) of the enclosing op, -1 for top-level ops."""

    def self_ns(self) -> np.ndarray:
        """Each op's duration minus its children's (never below 0)."""
        dur = (self.end - self.start).astype(np.int64)
        has = self.parent >= 0
        children = np.bincount(self.parent[has], weights=dur[has], minlength=len(dur))
        return cast(np.ndarray, np.maximum(dur - children.astype(np.int64), 0))

    def innermost(self, chosen: np.ndarray) -> iv.Intervals:
        """The instants whose innermost op is one of ``chosen`` (a mask over the tree's ops)."""
        out: list[iv.Intervals] = []
        for d in range(int(self.depth.max(initial=-1)) + 1):
            at = self.depth == d
            mine = at & chosen
            if not mine.any():
                continue
            deeper = self.depth == d + 1
            covered = iv.union(self.start[mine], self.end[mine])
            out.append(iv.subtract(covered, iv.union(self.start[deeper], self.end[deeper])))
        if not out:
            return self.start[:0], self.end[:0]
        return iv.union(np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out]))


def op_tree(start: np.ndarray, end: np.ndarray) -> OpTree:
    """Build the tree of one thread's ops given their ``[start, end)`` (see the module doc)."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    keep = np.flatnonzero(end > start)
    order = keep[np.lexsort((start[keep] - end[keep], start[keep]))]
    s, e = start[order], end[order]
    depth = np.arange(len(s)) - np.searchsorted(np.sort(e), s, side="right")
    depth = np.maximum(depth, 0)
    parent = np.full(len(s), -1, dtype=np.int64)
    for d in range(1, int(depth.max(initial=0)) + 1):
        below = np.flatnonzero(depth == d - 1)
        here = np.flatnonzero(depth == d)
        pos = np.searchsorted(below, here) - 1
        ok = pos >= 0
        parent[here[ok]] = below[pos[ok]]
    return OpTree(rows=order, start=s, end=e, depth=depth, parent=parent)
